"""The chaos harness: a real local job under a seeded schedule of faults, then an audit.

It runs a whole job in-process with `paddlecloud.local.job.LocalJob` — a real etcd on
disk, two masters, N stub trainers that only read and log records (the model is not
the point) — over generated data whose every record carries a unique id, and while it
runs injects faults drawn from a seeded random schedule:

  trainer-kill     SIGKILL a trainer (it is restarted and rejoins with its id)
  master-kill      SIGKILL the leading master (the standby takes over)
  trainer-pause    SIGSTOP a trainer past its session TTL, then SIGCONT
  master-pause     SIGSTOP the leading master past its election lease, then SIGCONT
  etcd-restart     SIGKILL etcd and start it again on the same data directory
  resize           ScaleTrainers to another size in the job's range (PS-style: trainers
                   join with the next ids or leave gracefully with SIGTERM)

Two more are part of every run: a few poisoned records (their tasks must end failed
each epoch after --max-task-failures, and the job must finish the rest) and one
broken trainer that gives back every task it takes (its tasks must be finished by
the others, not marked failed).

The audit reads the trainers' record logs and etcd's history: every record read at
least once per epoch (poisoned tasks aside), every task counted done exactly once per
epoch, no epoch skipped, the job ended. One line per run says it all.

Reproduce a run: `python -m tests.chaos.harness --seed 7` (add `--faults 12 --epochs 5`
for a longer schedule).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from paddlecloud.etcd_server import EtcdServer
from paddlecloud.history import MarkEvent, audit_done_marks, mark_history
from paddlecloud.keys import JobKeys
from paddlecloud.local.job import LocalJob, LocalJobSpec, master_address

FAULTS = ("trainer-kill", "master-kill", "trainer-pause", "master-pause", "etcd-restart", "resize")
SESSION_TTL = 2.0
ELECTION_TTL = 2.0
MAX_TASK_FAILURES = 1


@dataclass
class ChaosResult:
    seed: int
    faults: list[str]
    exit_code: int
    records: int = 0
    read_twice: int = 0
    tasks_lost: int = 0
    double_counted: int = 0
    failed_tasks: int = 0
    epochs_completed: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.exit_code == 0

    def line(self) -> str:
        return (f"seed={self.seed} faults=[{', '.join(self.faults)}] records={self.records} "
                f"read_twice={self.read_twice} tasks_lost={self.tasks_lost} "
                f"double_counted={self.double_counted} failed_tasks={self.failed_tasks} "
                f"epochs={self.epochs_completed} exit={self.exit_code} "
                f"{'OK' if self.ok else 'FAIL: ' + '; '.join(self.problems)}")


def _has_data(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0


def write_data(directory: Path, *, files: int, records: int, poisoned_files: int) -> tuple[set[str], set[str]]:
    """CSV shards of unique record ids; the first `poisoned_files` files carry a POISON line."""
    directory.mkdir(parents=True, exist_ok=True)
    clean, poisoned = set(), set()
    for f in range(files):
        lines = [f"r{f:03d}-{i:05d},{(f * 7919 + i) % 1000}" for i in range(records)]
        if f < poisoned_files:
            lines.insert(records // 2, f"POISON-{f},x")
            poisoned.update(lines)
        else:
            clean.update(lines)
        (directory / f"part-{f:03d}.csv").write_text("\n".join(lines) + "\n")
    return clean, poisoned


class Chaos:
    def __init__(self, *, seed: int, workdir: Path, trainers: int = 4, epochs: int = 3,
                 faults: int = 4, files: int = 12, records: int = 150) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.workdir = workdir
        self.trainers = trainers
        self.epochs = epochs
        self.fault_count = faults
        self.files, self.records_per_file = files, records
        self.injected: list[str] = []
        self.log_lines: list[str] = []

    def schedule(self) -> list[tuple[float, str]]:
        """(seconds after the first record, fault) — reproducible from the seed."""
        times = sorted(self.rng.uniform(0.5, 6.0) for _ in range(self.fault_count))
        return [(t, self.rng.choice(FAULTS)) for t in times]

    async def run(self) -> ChaosResult:
        data = self.workdir / "data"
        clean, poisoned = write_data(data, files=self.files, records=self.records_per_file, poisoned_files=1)
        records_log = self.workdir / "records.tsv"
        job_name = f"chaos-{self.seed}"
        # The harness owns etcd (on disk, default flags): to restart it, and to read its history after.
        self.etcd = EtcdServer(str(self.workdir / "etcd"))
        await asyncio.to_thread(self.etcd.start)
        spec = LocalJobSpec(
            job=job_name, module="trainer_agent.stub", output=self.workdir / "out",
            inputs=(str(data / "*.csv"),), trainers=self.trainers, epochs=self.epochs, masters=2,
            min_trainers=max(1, self.trainers - 2), max_trainers=self.trainers,
            env=(("PADDLECLOUD_RECORD_LOG", str(records_log)),
                 ("PADDLECLOUD_STUB_BROKEN_IDS", str(self.trainers - 1)),
                 ("PADDLECLOUD_MASTER_DEADLINE", "120")),
            module_args=("--delay", "0.002"), restart_mode="trainer", restart_limit=50,
            etcd_endpoints=self.etcd.endpoint,
            session_ttl=f"{SESSION_TTL:g}s", election_ttl=f"{ELECTION_TTL:g}s",
            master_args=("--chunk-bytes", "1000", "--max-task-failures", str(MAX_TASK_FAILURES)),
        )
        job = LocalJob(spec, on_line=lambda who, text: self.log_lines.append(f"[{who}] {text}"))
        runner = asyncio.create_task(job.run())
        injector = asyncio.create_task(self._inject(job, records_log))
        try:
            code = await asyncio.wait_for(runner, 300)
        finally:
            injector.cancel()
            await asyncio.gather(injector, return_exceptions=True)
        result = ChaosResult(self.seed, self.injected, code)
        try:
            keys = JobKeys("local", job_name)
            done = await mark_history(self.etcd.endpoint, keys, "done")
            failures = await mark_history(self.etcd.endpoint, keys, "failures")
        finally:
            await asyncio.to_thread(self.etcd.stop)
        self._audit(result, records_log, clean, job, done, failures)
        return result

    async def _inject(self, job: LocalJob, records_log: Path) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the faults start once records flow
            if await asyncio.to_thread(_has_data, records_log):
                break
            await asyncio.sleep(0.05)
        started = time.monotonic()
        for at, fault in self.schedule():
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            if job.progress.phase in ("Succeeded", "Failed"):
                return
            await self._fault(job, fault)

    async def _fault(self, job: LocalJob, fault: str) -> None:
        healthy = [t for t in job.trainers if t.running]
        leader = next((m for m in job.masters
                       if m.running and master_address(m) == job.progress.leader), None)
        if fault.startswith("trainer") and not healthy:
            return
        if fault.startswith("master") and leader is None:
            return
        if fault == "resize":
            low, high = max(1, self.trainers - 2), self.trainers
            size = self.rng.choice([n for n in range(low, high + 1)
                                    if n != job.progress.desired_trainers] or [high])
            try:
                if await job.scale(size) is None:
                    return  # no leader known now (another fault): not injected
            except grpc.aio.AioRpcError:
                return  # the leader does not serve now (another fault): not injected
            self.injected.append(f"resize->{size}")
            return
        self.injected.append(fault)
        if fault == "trainer-kill":
            self.rng.choice(healthy).signal(signal.SIGKILL)
        elif fault == "master-kill":
            leader.signal(signal.SIGKILL)
        elif fault == "trainer-pause":
            await self._pause(self.rng.choice(healthy), SESSION_TTL + 1.5)
        elif fault == "master-pause":
            await self._pause(leader, ELECTION_TTL + 1.5)
        elif fault == "etcd-restart":
            await asyncio.to_thread(self.etcd.kill, signal.SIGKILL)
            await asyncio.to_thread(self.etcd.start)

    @staticmethod
    async def _pause(child, seconds: float) -> None:
        child.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            child.signal(signal.SIGCONT)

    def _audit(self, result: ChaosResult, records_log: Path, clean: set[str], job: LocalJob,
               done: list[MarkEvent], failures: list[MarkEvent]) -> None:
        per_epoch: dict[int, Counter] = {}
        for line in records_log.read_text().split("\n") if records_log.exists() else []:
            parts = line.split("\t")
            if len(parts) == 4:  # a torn last line of a killed trainer is dropped
                per_epoch.setdefault(int(parts[0]), Counter())[parts[3]] += 1
        result.records = len(clean)
        result.read_twice = sum(n - 1 for c in per_epoch.values() for r, n in c.items() if r in clean and n > 1)
        for epoch in range(self.epochs):
            missing = clean - set(per_epoch.get(epoch, ()))
            if missing:
                result.problems.append(f"epoch {epoch}: {len(missing)} records never read")
        failed = {(f.epoch, f.task) for f in failures
                  if f.kind == "PUT" and int(f.value or 0) > MAX_TASK_FAILURES}
        result.failed_tasks = len(failed)
        marks = audit_done_marks(done, epochs=self.epochs, failed=failed)
        result.double_counted = len(marks.double_counted)
        result.epochs_completed = len(marks.passes)
        result.tasks_lost = marks.lost_count
        if result.double_counted:
            result.problems.append(f"{result.double_counted} tasks counted twice")
        if result.tasks_lost:
            result.problems.append(f"{result.tasks_lost} tasks neither done nor failed")
        if result.epochs_completed != self.epochs:
            result.problems.append(f"{result.epochs_completed} of {self.epochs} epochs completed")
        failed_per_epoch = {e: {t for fe, t in failed if fe == e} for e in range(self.epochs)}
        poisoned_tasks = set().union(*failed_per_epoch.values())
        if len(poisoned_tasks) != 1 or any(len(ts) != 1 for ts in failed_per_epoch.values()):
            # One task holds the poison line: it, and only it, must end failed in every epoch
            # (the broken trainer's give-backs and the faults must never make a task fail).
            result.problems.append(f"failed tasks per epoch {failed_per_epoch}: expected the one "
                                   "poisoned task in every epoch")
        if job.progress.phase != "Succeeded":
            result.problems.append(f"the job ended {job.progress.phase}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.harness", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, action="append", help="seed(s) to run (repeatable)")
    parser.add_argument("--faults", type=int, default=4, help="faults per run")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--trainers", type=int, default=4)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    failed = 0
    for seed in args.seed or [1]:
        workdir = Path(tempfile.mkdtemp(prefix=f"chaos-{seed}-"))
        chaos = Chaos(seed=seed, workdir=workdir, trainers=args.trainers, epochs=args.epochs, faults=args.faults)
        result = asyncio.run(chaos.run())
        print(result.line(), flush=True)
        if not result.ok:
            failed += 1
            (workdir / "console.log").write_text("\n".join(chaos.log_lines))
            print(f"  logs kept in {workdir}", flush=True)
        elif not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
