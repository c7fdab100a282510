"""The local group restart's order: a death is acted on at once, the new launchers start beside
the old group's stop, and their commands start only once the old group is gone and the epoch
restarted (the start gate), rank 0's first. Real launchers, a real master, real processes; no
Paddle."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from datasets import write_records
from masters import wait_serving
from processes import job_processes

from paddlecloud.backends.local.children import Child
from paddlecloud.backends.local.deployer import PEER_HEAD_START, LocalDeployer, launcher_command
from paddlecloud.deployer import START_GATE_ENV
from paddlecloud.supervision import MasterState, supervise

POLL = 60.0  # the supervisor's poll: acting sooner than this is acting on the death itself

# Trainer 1's first run dies (exit 1); every other run notes its start and waits to be stopped.
TRAINER = """
import os, pathlib, sys, time
rank, died = os.environ["PADDLE_TRAINER_ID"], pathlib.Path(sys.argv[1]) / "died"
with open(pathlib.Path(sys.argv[1]) / "starts", "a") as log:
    log.write(f"{rank} {time.time()}\\n")
if rank == "1" and not died.exists():
    died.touch()
    time.sleep(1)
    sys.exit(1)
time.sleep(600)
"""


def starts(tmp: Path) -> list[tuple[str, float]]:
    path = tmp / "starts"
    lines = path.read_text().split("\n") if path.exists() else []
    return [(rank, float(at)) for rank, at in (line.split() for line in lines if line)]


async def until(predicate, *, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_death_restarts_the_group_at_once_with_launchers_started_beside_the_stop(
        tmp_path, start_master, job_name):
    write_records(tmp_path / "data", files=1, records_per_file=1)
    master = start_master("--input", str(tmp_path / "data"))
    await wait_serving(master.address, process=master)
    wake = asyncio.Event()
    restarted: list[dict] = []

    def spawn(role: str, index: int, command: list[str], env: dict[str, str]) -> Child:
        return Child(role=role, index=index, command=command, env=env, log_dir=tmp_path / "logs",
                     on_line=lambda who, line: None, on_exit=lambda child: wake.set())

    def snapshot() -> dict:
        # the launchers (their commands' environment lacks the gate)
        gated = [env[START_GATE_ENV] for _, _, env in job_processes(job_name) if START_GATE_ENV in env]
        return {"at": time.time(), "gated": gated, "open": [os.path.exists(g) for g in gated],
                "starts": starts(tmp_path), "old_alive": [t.running for t in deployer.trainers]}

    async def restart_epoch(epoch: int, done: tuple[int, ...]) -> None:
        restarted.append(snapshot())

    deployer = LocalDeployer(
        trainers=2, pservers=0, output=tmp_path / "output", restart_limit=3, restart_mode="group",
        trainer_command=launcher_command("trainer", [sys.executable, "-c", TRAINER, str(tmp_path)]),
        pserver_command=[], spawn=spawn, restart_epoch=restart_epoch, event=lambda text: None,
        user_env=lambda: {**os.environ, "PADDLE_MASTER_ENDPOINT": master.address,
                          "PADDLE_JOB_NAME": job_name})
    job = asyncio.create_task(supervise(
        deployer, num_pservers=0, registered_pservers=lambda: _const(0),
        master_state=lambda: _const(MasterState(has_dataset=True)), poll_interval=POLL, wake=wake))
    try:
        await until(lambda: restarted or job.done(), timeout=POLL / 2)
        assert not job.done(), job.exception()
        before = restarted[0]
        # the old group was gone, the new launchers up and held, no new command started yet
        assert before["old_alive"] == [False, False]
        assert len(before["gated"]) == 2 and before["open"] == [False, False]
        assert sorted(rank for rank, _ in before["starts"]) == ["0", "1"]
        await until(lambda: len(starts(tmp_path)) == 4)
        again = dict(starts(tmp_path)[2:])
        # rank 0 first: its peers only once it had a head start (Paddle's store listens first)
        assert again["0"] > before["at"] and again["1"] > before["at"] + PEER_HEAD_START
        assert deployer.restarts == 1 and all(t.running for t in deployer.trainers)
    finally:
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)
        await deployer.cleanup(succeeded=False)
    assert [pid for pid, _, env in job_processes(job_name) if "PADDLE_TRAINER_ID" in env] == []


async def _const(value):
    return value


# Trainer 0's first run is SIGKILLed; trainer 1's first run, stopped after that death, aborts
# as a gloo peer does (its collective lost trainer 0) instead of ending on the SIGTERM.
KILLED_AND_ABORTED = """
import os, pathlib, signal, sys, time
rank, first = os.environ["PADDLE_TRAINER_ID"], pathlib.Path(sys.argv[1]) / f"ran-{os.environ['PADDLE_TRAINER_ID']}"
again = first.exists()
first.touch()
if not again and rank == "1":
    signal.signal(signal.SIGTERM, lambda *_: os.abort())
if not again and rank == "0":
    time.sleep(1)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(600)
"""


async def test_a_killed_member_and_the_peer_that_aborted_after_it_are_told_apart(
        tmp_path, start_master, job_name):
    """The README's kill recipe, told as it happened: trainer 0 died (first), trainer 1 aborted
    as its consequence; the launcher says "aborted", not "killed by SIGABRT"."""
    write_records(tmp_path / "data", files=1, records_per_file=1)
    master = start_master("--input", str(tmp_path / "data"))
    await wait_serving(master.address, process=master)
    wake = asyncio.Event()
    events: list[str] = []
    lines: list[str] = []

    def spawn(role: str, index: int, command: list[str], env: dict[str, str]) -> Child:
        return Child(role=role, index=index, command=command, env=env, log_dir=tmp_path / "logs",
                     on_line=lambda who, line: lines.append(f"[{who}] {line}"),
                     on_exit=lambda child: wake.set())

    async def restart_epoch(epoch: int, done: tuple[int, ...]) -> None:
        return None

    deployer = LocalDeployer(
        trainers=2, pservers=0, output=tmp_path / "output", restart_limit=3, restart_mode="group",
        trainer_command=launcher_command("trainer", [sys.executable, "-c", KILLED_AND_ABORTED, str(tmp_path)]),
        pserver_command=[], spawn=spawn, restart_epoch=restart_epoch, event=events.append,
        user_env=lambda: {**os.environ, "PADDLE_MASTER_ENDPOINT": master.address,
                          "PADDLE_JOB_NAME": job_name})
    job = asyncio.create_task(supervise(
        deployer, num_pservers=0, registered_pservers=lambda: _const(0),
        master_state=lambda: _const(MasterState(has_dataset=True)), poll_interval=POLL, wake=wake))
    try:
        await until(lambda: deployer.restarts == 1 or job.done(), timeout=POLL / 2)
        assert not job.done(), job.exception()
    finally:
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)
        await deployer.cleanup(succeeded=False)
    said = [e for e in events if e.startswith("trainer")]  # not the job's phases
    assert said == ["trainer 0 died: restarting the trainer group",
                    "trainer 1 aborted without its gloo peer after trainer 0 died"], events
    told = "\n".join(lines)
    assert "trainer 1 aborted (SIGABRT)" in told and "killed by SIGABRT" not in told, told
    assert "trainer 0 killed by SIGKILL" in told, told
