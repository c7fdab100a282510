"""Helpers to run stub trainer processes and read their record logs."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

_numbers = itertools.count()


class StubTrainer:
    """`python -m trainer_agent.stub` as a child process with the PaddlePaddle-style env."""

    def __init__(self, *, trainer_id: str, log: Path, tmp: Path, master: str | None = None,
                 etcd: str | None = None, job: str | None = None, args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> None:
        self.trainer_id = trainer_id
        self.log = log
        # one file per process, also for two processes of one trainer id
        self.output = tmp / f"trainer-{trainer_id.replace('/', '_')}-{next(_numbers)}.out"
        self.env = dict(os.environ, PADDLE_TRAINER_ID=trainer_id, PYTHONUNBUFFERED="1",
                        PADDLECLOUD_RECORD_LOG=str(log), PADDLECLOUD_MASTER_DEADLINE="60", **(env or {}))
        if master:
            self.env["PADDLE_MASTER_ENDPOINT"] = master
        if etcd:
            self.env.update(PADDLE_ETCD_ENDPOINTS=etcd, PADDLE_JOB_NAME=job or "")
        self.args = args
        self.process: subprocess.Popen | None = None

    def start(self) -> StubTrainer:
        with open(self.output, "ab") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "trainer_agent.stub", *self.args],
                                            stdout=out, stderr=subprocess.STDOUT, env=self.env)
        return self

    def wait(self, timeout: float = 120) -> int:
        return self.process.wait(timeout=timeout)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
                self.process.wait(timeout=30)

    def output_text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=30)


def read_log(path: Path) -> list[tuple[int, str, int, str]]:
    """(epoch, trainer, task, record) per line; a torn last line (SIGKILL) is dropped."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().split("\n"):
        parts = line.split("\t")
        if len(parts) == 4:
            rows.append((int(parts[0]), parts[1], int(parts[2]), parts[3]))
    return rows


def reads_per_epoch(rows) -> dict[int, Counter]:
    epochs: dict[int, Counter] = {}
    for epoch, _, _, record in rows:
        epochs.setdefault(epoch, Counter())[record] += 1
    return epochs
