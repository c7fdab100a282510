"""A trainer stopped with SIGTERM leaves the master before it dies, even from inside a C call.

A trainer that dies without leaving keeps its session until the session's TTL lapses:
the master counts it alive, keeps the tasks it held (PS mode) and any save-model grant
for that long. Backends stop trainers with SIGTERM (a scale-down, a group restart, a
deleted pod), and SIGTERM's default action kills at once; Python runs a handler only
in the main thread, between bytecodes, so a handler alone would wait as long as the
main thread sits in a long C++ call (an `all_reduce` waiting for a peer that died).

`install()` (called where a TaskClient or a MasterDataset is made, and by
`track(session)`, with which every `Session` registers itself) sets up, once per process,
from the main thread (a Paddle DataLoader registers from a thread of its own), and only
where SIGTERM has no Python handler yet:
- a Python handler for SIGTERM, and
- a wakeup fd: Python's C-level handler writes each signal's number to it at once, and
  a daemon thread reading it acts even while the main thread is inside C code.
Whichever comes first sends `LeaveTrainer` for every live session of the process (at
most LEAVE_TIMEOUT seconds in all), flushes stdout/stderr, and exits with 128+SIGTERM,
the code a death by SIGTERM is reported with (`paddlecloud.exits`).

What this does NOT do: flush acknowledgements or give tasks back one by one (leaving
returns every held task at once), or run the program's `finally` blocks — a program
that wants those installs its own SIGTERM handler (before or after: either way this
one stands aside or is replaced). Forked children (DataLoader workers) start with
SIGTERM's default action and no wakeup fd, and install their own on their first session.

**Draining to a checkpoint (preemption).** A program that can save exactly where its model
is (a `MasterDataset(drain_on_stop=True)`, see `trainer_agent.paddle`) calls
`drain_on_stop()`. SIGTERM then does not leave at once: it sets `stop_requested()` (the
reading ends between tasks, `trainer_agent.client.Epoch`; the group agrees on the tasks
the model consumed; the program saves them and exits with `STOPPED_EXIT`), and starts a
watchdog. If the process is still there after `stop_grace()` seconds (`$PADDLECLOUD_STOP_GRACE`, which backends set
below the time they wait before SIGKILL), the watchdog leaves and exits as above: the last
checkpoint stands, and the log says so. It leaves sooner when the group stopped stepping:
a training loop that calls `note_progress()` each step (`trainer_agent.paddle.join_batches`
does) and made none for `$PADDLECLOUD_STOP_STALL` seconds (default 3) since the stop is
stuck in a collective with a member that is gone, and can never reach the boundary; once
the group agreed to stop (`saving()`), only the grace bounds the save. A PS trainer
(`trainer_agent.ps`) waits on no peer: only the grace bounds its drain (`stall=False`).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
import weakref
from typing import Any, Protocol

from paddlecloud.exits import STOP_GRACE_ENV

logger = logging.getLogger(__name__)

LEAVE_TIMEOUT = 2.0  # seconds all the sessions of a stopped process have to leave
STOPPED_EXIT = 128 + signal.SIGTERM  # the exit code of a trainer stopped by SIGTERM
DEFAULT_STOP_GRACE = 20.0  # seconds a drain may take when the backend does not say
STOP_STALL_ENV = "PADDLECLOUD_STOP_STALL"
DEFAULT_STOP_STALL = 3.0   # seconds without a step after which a drain is given up


class Leaving(Protocol):
    def leave(self, *, timeout: float) -> None: ...


_sessions: weakref.WeakSet[Any] = weakref.WeakSet()
_installed_in = 0         # the pid that installed the handlers (0: none)
_stopping = threading.Lock()
_draining = False         # SIGTERM drains instead of leaving at once (drain_on_stop)
_stop_requested = threading.Event()
_first_stop = threading.Lock()  # held from the first SIGTERM of a drain on
_progress = [0.0]         # when the training loop last stepped (monotonic; note_progress)
_saving = threading.Event()  # the group agreed to stop: only the grace bounds the save


def track(session: Leaving) -> None:
    """Makes `session` leave when this process is stopped with SIGTERM."""
    _sessions.add(session)
    install()


def untrack(session: Leaving) -> None:
    _sessions.discard(session)


def _seconds_from_env(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        return max(0.0, float(raw)) if raw else default
    except ValueError:
        logger.warning("%s=%r is not a number of seconds: using %gs", name, raw[:20], default)
        return default


def stop_grace() -> float:
    """Seconds a drain may take before the watchdog leaves anyway (`$PADDLECLOUD_STOP_GRACE`)."""
    return _seconds_from_env(STOP_GRACE_ENV, DEFAULT_STOP_GRACE)


def note_progress() -> None:
    """The training loop stepped (a collective completed): a drain still moves."""
    _progress[0] = time.monotonic()


def saving() -> None:
    """The group agreed to stop at a boundary: the stall rule no longer applies to the save."""
    _saving.set()


def drain_on_stop(enabled: bool = True, *, stall: bool = True) -> None:
    """On SIGTERM, set `stop_requested()` and start the watchdog instead of leaving at once
    (False: leave at once again). See the module docstring. `stall=False` (a PS trainer,
    which waits on no peer in a collective) bounds the drain by the grace alone."""
    global _draining
    _draining = enabled
    if not stall:
        saving()
    install()


def stop_requested() -> bool:
    """Whether this process was asked to stop (SIGTERM) and is draining."""
    return _stop_requested.is_set()


def install() -> None:
    """The SIGTERM handler and its watching thread, where this is the main thread (see above)."""
    global _installed_in
    if _installed_in == os.getpid() or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # the program (or Paddle's C++ handler) handles SIGTERM itself
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    try:
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:  # not the main interpreter's main thread after all
        reader.close()
        writer.close()
        return
    if previous != -1:  # someone else's wakeup fd (an event loop's): leave it alone
        signal.set_wakeup_fd(previous)
        reader.close()
        writer.close()
        return
    signal.signal(signal.SIGTERM, _on_sigterm)
    threading.Thread(target=_watch, args=(reader, writer), name="sigterm-leave", daemon=True).start()
    _installed_in = os.getpid()


def _on_sigterm(signum: int, frame: Any) -> None:
    _stop()


def _watch(reader: socket.socket, writer: socket.socket) -> None:
    """Reads the signal numbers Python's C handler writes; leaves on SIGTERM unless the
    program put a handler of its own in place of ours since."""
    del writer  # kept open by the wakeup fd; held here only so it is not collected first
    while True:
        try:
            data = reader.recv(64)
        except OSError:
            return
        if not data:
            return
        if signal.SIGTERM in data and signal.getsignal(signal.SIGTERM) is _on_sigterm:
            _stop()


def _stop() -> None:
    """SIGTERM: drain when the process asked to (`drain_on_stop`), else leave now.

    Both the Python handler and the watching thread call this for one signal: the first to
    come drains, the other (and any later SIGTERM) finds the drain under way: the watchdog
    bounds it."""
    if not _draining:
        _leave_and_exit()
        return
    if not _first_stop.acquire(blocking=False):
        return  # the other half of the same signal, or a later one: the watchdog is set
    _stop_requested.set()
    grace = stop_grace()
    logger.warning("stopped by SIGTERM: draining to a checkpoint (within %gs)", grace)
    threading.Thread(target=_watchdog, args=(grace, _seconds_from_env(STOP_STALL_ENV, DEFAULT_STOP_STALL)),
                     name="sigterm-drain-watchdog", daemon=True).start()


def _watchdog(grace: float, stall: float) -> None:
    """Leaves when the grace is spent, or sooner when the loop made no step for `stall`
    seconds since the stop (a group with a member gone never reaches its boundary)."""
    stopped = time.monotonic()
    while True:
        now = time.monotonic()
        if now - stopped >= grace:
            why = f"the drain did not end within {grace:g}s ({STOP_GRACE_ENV})"
            break
        if not _saving.is_set() and now - max(_progress[0], stopped) >= stall:
            why = (f"no training step for {stall:g}s ({STOP_STALL_ENV}): the group cannot reach a "
                   "boundary (a member is gone)")
            break
        time.sleep(0.05)
    logger.warning("%s: leaving now; the last checkpoint stands", why)
    _leave_and_exit()


def _leave_and_exit() -> None:
    """Every live session leaves (bounded), then the process exits as killed by SIGTERM."""
    if not _stopping.acquire(blocking=False):
        return  # the other path is at it; it ends the process
    deadline = time.monotonic() + LEAVE_TIMEOUT
    for session in list(_sessions):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            session.leave(timeout=left)
        except Exception as error:  # the session lapses with its TTL: nothing is lost
            logger.warning("stopped by SIGTERM; leaving the master failed: %s", error)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(STOPPED_EXIT)


def _reset_in_child() -> None:
    """A forked child has no watching thread: SIGTERM's default action, no wakeup fd."""
    global _installed_in, _stopping, _draining, _first_stop
    _draining = False
    _first_stop = threading.Lock()
    _stop_requested.clear()
    _saving.clear()
    if _installed_in:
        _installed_in = 0
        _stopping = threading.Lock()
        _sessions.clear()
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except ValueError:
            pass


os.register_at_fork(after_in_child=_reset_in_child)
