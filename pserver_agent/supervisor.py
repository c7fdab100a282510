"""Runs the pserver command as a child process and restarts it when it crashes.

The restart contract, what a pserver program can rely on:

* Every start gets `PADDLECLOUD_RESTART_COUNT=<n>`: 0 at the agent's first start of
  the pserver, then 1, 2, ... for each restart after a crash.
* `PADDLECLOUD_PSERVER_RESTORE=1` tells the pserver to load its last checkpoint,
  if it has one, before serving: it is set on every restart, and also on the first
  start when the slot was served before (another agent held it and went away), or
  when the agent itself was started with `PADDLECLOUD_PSERVER_RESTORE=1` (a job resumed
  from a checkpoint: `paddlecloud local train` run again on its output); otherwise it
  is `0`. The checkpoint is the job's newest complete version under
  `$PADDLECLOUD_OUTPUT/checkpoints` (`trainer_agent.checkpoint.load_checkpoint`): the one
  the master restarts the epoch at after a suspend, which a PS job's trainer 0 saves
  with the pservers' model (`trainer_agent.ps`). A pserver told to restore that finds no checkpoint must start
  fresh: a slot can be claimed and lose its agent before any checkpoint was written.
* A crash is an exit with a non-zero code or by a signal. The n-th restart waits
  `backoff * 2**(n-1)` seconds (at most `max_backoff`); past `limit` restarts the
  supervisor gives up and returns the last exit code. An exit with code 0 is not a
  crash: the pserver ended by itself and is not restarted.
* Stopping sends a signal (SIGTERM unless told otherwise) to the pserver's process
  group, then SIGKILL to the group after `grace` seconds.

The child runs in a session (process group) of its own, so a Ctrl-C at a terminal
reaches it once, through the agent. On Linux it is also SIGKILLed by the kernel
when the agent dies (`PR_SET_PDEATHSIG`, armed by a small interpreter that then
execs the command in place), so a SIGKILLed agent leaves no pserver holding the
slot's port.

What this does NOT guarantee: that the pserver's own children die with it when it
moves them to another process group; the parent-death signal on other systems than
Linux; that the restart limit is ever reset (it counts every restart of this
agent's life: restart the agent to start counting again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from paddlecloud.deployer import PSERVER_RESTORE_ENV
from paddlecloud.exits import exit_code

logger = logging.getLogger(__name__)

# Run before the pserver's own exec, in the child: arm SIGKILL-on-parent-death
# (PR_SET_PDEATHSIG = 1, kept across exec), give up if the agent is already gone,
# then become the pserver (same pid). A separate tiny interpreter rather than a
# `preexec_fn`, which is unsafe in a process with threads (gRPC's).
_EXEC_WITH_PDEATHSIG = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL)\n"
    "if os.getppid() != int(sys.argv[1]): os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def launch_argv(command: Sequence[str]) -> list[str]:
    """The argv that runs `command` so that it dies with this process (Linux); `command` elsewhere."""
    if not sys.platform.startswith("linux"):
        return list(command)
    return [sys.executable, "-I", "-S", "-c", _EXEC_WITH_PDEATHSIG, str(os.getpid()), *command]


@dataclass(frozen=True)
class RestartPolicy:
    """Restarts after a crash: at most `limit`, the n-th after `backoff * 2**(n-1)` seconds."""

    limit: int = 5
    backoff: float = 1.0
    max_backoff: float = 30.0

    def __post_init__(self) -> None:
        if self.limit < 0:
            raise ValueError(f"restart limit {self.limit} is negative: use 0 for no restart")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ValueError(f"backoff {self.backoff:g}s / max {self.max_backoff:g}s: must be >= 0")

    def delay(self, restart: int) -> float:
        return min(self.max_backoff, self.backoff * 2 ** (restart - 1))


class PserverSupervisor:
    """One pserver child at a time: `run()` starts and restarts it, `stop()` ends it for good."""

    def __init__(self, *, command: Sequence[str], env: Mapping[str, str], policy: RestartPolicy,
                 grace: float, restore_first: bool) -> None:
        if grace <= 0:
            raise ValueError(f"grace {grace:g}s must be positive")
        self.command = tuple(command)
        self.env = dict(env)
        self.policy = policy
        self.grace = grace
        self.restore_first = restore_first
        self.restarts = 0
        self._process: asyncio.subprocess.Process | None = None
        self._stop_signal: int | None = None
        self._stopping = asyncio.Event()
        self._running = False
        self._finished = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def env_for(self, restarts: int) -> dict[str, str]:
        restore = restarts > 0 or self.restore_first
        return {**self.env, "PADDLECLOUD_RESTART_COUNT": str(restarts),
                PSERVER_RESTORE_ENV: "1" if restore else "0"}

    async def run(self) -> int | None:
        """Runs the pserver until it exits 0, is stopped, or crashes past the limit.

        Returns the exit code the agent should end with: the pserver's last one
        (shell style), or None when `stop()` came while no pserver was running.
        """
        self._running = True
        try:
            return await self._run()
        finally:
            self._finished.set()

    async def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stops for good: `sig` to the pserver, SIGKILL after the grace period; returns once it is gone."""
        if self._stop_signal is None:
            self._stop_signal = sig
            self._stopping.set()
        if self._running:
            await self._finished.wait()

    def forward(self, sig: int) -> None:
        """Sends `sig` to the running pserver, if any (a second Ctrl-C, say)."""
        if self._process is not None and self._process.returncode is None:
            self._send(self._process, sig)

    async def _run(self) -> int | None:
        while True:
            if self._stopping.is_set():
                return None
            try:
                self._process = await asyncio.create_subprocess_exec(
                    *launch_argv(self.command), env=self.env_for(self.restarts),
                    start_new_session=True)
            except OSError as error:
                logger.error("cannot start the pserver %s: %s", " ".join(self.command), error)
                return 127
            logger.info("pserver started (pid %d, restart %d): %s", self._process.pid, self.restarts,
                        " ".join(self.command))
            code = await self._wait_or_stop(self._process)
            if self._stopping.is_set():
                logger.info("pserver stopped (exit code %d)", code)
                return code
            if code == 0:
                logger.info("pserver exited with 0 by itself: not restarting it")
                return 0
            if self.restarts >= self.policy.limit:
                logger.error("pserver exited with %d after %d restarts (--restart-limit %d): giving up",
                             code, self.restarts, self.policy.limit)
                return code
            self.restarts += 1
            delay = self.policy.delay(self.restarts)
            logger.warning("pserver exited with %d: restart %d of %d in %gs", code, self.restarts,
                           self.policy.limit, delay)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)

    async def _wait_or_stop(self, process: asyncio.subprocess.Process) -> int:
        """Waits for the pserver to exit; on `stop()`, signals it and SIGKILLs it after the grace."""
        exited = asyncio.ensure_future(process.wait())
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not exited.done():
                sig = self._stop_signal or signal.SIGTERM
                logger.info("stopping the pserver (pid %d) with %s", process.pid, signal.Signals(sig).name)
                self._send(process, sig)
                try:
                    await asyncio.wait_for(asyncio.shield(exited), self.grace)
                except asyncio.TimeoutError:
                    logger.warning("pserver (pid %d) still running %gs after %s: SIGKILL", process.pid,
                                   self.grace, signal.Signals(sig).name)
                    self._kill_group(process, signal.SIGKILL)
                    await exited
            return exit_code(exited.result())
        finally:
            stopping.cancel()
            # What it left behind would hold its port; cancelled from outside, the pserver
            # itself must not be left behind either.
            self._kill_group(process, signal.SIGKILL)
            exited.cancel()

    def _send(self, process: asyncio.subprocess.Process, sig: int) -> None:
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(sig)

    @staticmethod
    def _kill_group(process: asyncio.subprocess.Process, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
