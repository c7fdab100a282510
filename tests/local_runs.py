"""`paddlecloud local train` as a child process, for the tests of the local backend."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from processes import job_processes


class LocalRun:
    """The CLI as a child process, its console output in a file."""

    def __init__(self, tmp: Path, job: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.job = job
        self.output = tmp / "out"
        self.console = tmp / "console.txt"
        self.records = tmp / "records.tsv"
        command = [sys.executable, "-m", "paddlecloud", "local", "train", "--job", job,
                   "--output", str(self.output), "-e", f"PADDLECLOUD_RECORD_LOG={self.records}", *args]
        with open(self.console, "wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                            env=dict(env or os.environ, PYTHONUNBUFFERED="1", COLUMNS="200"))

    def wait(self, timeout: float = 180) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            tail = "\n".join(self.text().splitlines()[-40:])
            raise AssertionError(f"local train still running after {timeout:g} s; its console ends:\n"
                                 f"{tail}") from None

    def text(self) -> str:
        return self.console.read_text(errors="replace")

    @property
    def operator_token(self) -> Path:
        """The token file of the run's operator role (what `job scale` must carry)."""
        return self.output / ".paddlecloud" / "tokens" / "operator"

    def scale(self, address: str, trainers: int) -> subprocess.CompletedProcess:
        """`paddlecloud job scale` against the run's master at ``address``, as its operator."""
        return subprocess.run([sys.executable, "-m", "paddlecloud", "job", "scale", self.job,
                               "--trainers", str(trainers), "--master", address],
                              capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, PADDLE_JOB_TOKEN_FILE=str(self.operator_token)))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for pid, _, _ in job_processes(self.job):
            os.kill(pid, signal.SIGKILL)


async def leader_of(endpoint: str, job: str) -> str:
    """The address a local job's elected master published in etcd ("" while none leads)."""
    from paddlecloud import etcd
    from paddlecloud.keys import JobKeys

    client = await etcd.connect(endpoint)
    try:
        found = await client.get(JobKeys("local", job).leader)
        return found.value.decode() if found is not None else ""
    finally:
        await client.close()
