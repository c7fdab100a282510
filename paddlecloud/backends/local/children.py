"""Child processes of a local job: started in their own process group, logs pumped line by line.

Each child's output goes to `<output>/logs/<role>-<index>.log` and, prefixed with its
role and index, to the console (less Paddle's noise: `paddlecloud.backends.local.noise`). Stopping
a child signals its whole process group, so a launcher and the user's command under it go
together and nothing is left behind. `on_exit` is called the moment a child's process ends, so
the supervisor acts on a death at once rather than at its next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

from paddlecloud.backends.local.noise import PaddleNoise

logger = logging.getLogger(__name__)


class Child:
    def __init__(self, *, role: str, index: int, command: list[str], env: dict[str, str],
                 log_dir: Path, on_line: Callable[[str, str], None],
                 on_exit: Callable[[Child], None] = lambda child: None) -> None:
        self.role = role
        self.index = index
        self.command = command
        self.env = env
        self.log_path = log_dir / f"{role}-{index}.log"
        self.on_line = on_line
        self.on_exit = on_exit
        self.process: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.expected_exit = False  # set when we stop it on purpose
        self._pump: asyncio.Task[None] | None = None
        self._exit_watch: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return f"{self.role} {self.index}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def returncode(self) -> int | None:
        return self.process.returncode if self.process is not None else None

    async def start(self) -> None:
        self.expected_exit = False
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.process = await asyncio.create_subprocess_exec(
            *self.command, env=self.env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        self._pump = asyncio.create_task(self._pump_lines(self.process), name=f"log-{self.name}")
        self._exit_watch = asyncio.create_task(self._tell_exit(self.process), name=f"exit-{self.name}")

    async def _tell_exit(self, process: asyncio.subprocess.Process) -> None:
        await process.wait()
        self.on_exit(self)

    async def _pump_lines(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        log = await asyncio.to_thread(open, self.log_path, "ab", buffering=0)
        noise = PaddleNoise()
        try:
            while line := await process.stdout.readline():
                log.write(line)  # unbuffered: a line at a time, as it comes
                text = line.decode(errors="replace").rstrip("\n")
                if noise.keep(text):
                    self.on_line(self.name, text)
        finally:
            log.close()

    def signal(self, sig: int) -> None:
        """Signals the child's whole process group."""
        if self.running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)

    async def restart(self) -> None:
        """Starts the child again once its last run is reaped; counts the restart."""
        self.restarts += 1
        await self.wait()
        await self.start()

    async def wait(self) -> int:
        assert self.process is not None
        code = await self.process.wait()
        if self._pump is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pump, 5)
        return code

    async def stop(self, *, grace: float = 10.0) -> None:
        """SIGTERM to the group, SIGKILL after `grace` seconds; returns when it is gone."""
        if self.process is None:
            return
        self.expected_exit = True
        if self.running:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), grace)
            except asyncio.TimeoutError:
                self.signal(signal.SIGKILL)
        await self.wait()
        # A child that outlived its leader in the group (it should not): make sure.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
