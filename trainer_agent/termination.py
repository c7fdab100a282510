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

logger = logging.getLogger(__name__)

LEAVE_TIMEOUT = 2.0  # seconds all the sessions of a stopped process have to leave


class Leaving(Protocol):
    def leave(self, *, timeout: float) -> None: ...


_sessions: weakref.WeakSet[Any] = weakref.WeakSet()
_installed_in = 0         # the pid that installed the handlers (0: none)
_stopping = threading.Lock()


def track(session: Leaving) -> None:
    """Makes `session` leave when this process is stopped with SIGTERM."""
    _sessions.add(session)
    install()


def untrack(session: Leaving) -> None:
    _sessions.discard(session)


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
    _leave_and_exit()


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
    os._exit(128 + signal.SIGTERM)


def _reset_in_child() -> None:
    """A forked child has no watching thread: SIGTERM's default action, no wakeup fd."""
    global _installed_in, _stopping
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
