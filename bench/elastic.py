"""Elastic jobs: how long from `ScaleTrainers` to the new size training, PS and collective, in one run.

Two local jobs (`paddlecloud.backends.local.job.LocalJob`: a private etcd, a master, stub trainers
that read and log records) are scaled while they run:

* PS-shaped (a stub pserver, trainers join and leave): 2 -> 4 trainers. Measured: from the
  ScaleTrainers call to the first record read by a new trainer (id 2 or 3), and to the
  first task it finished (its first record of a second task: the stub reports a task
  finished with its next GetTask).
* collective-shaped (group restarts): 2 -> 3 trainers. Measured: from the ScaleTrainers
  call to the first record read by the restarted group (trainer id 2 exists only there),
  and the records of the epoch read again after the restart (the group restarts the
  epoch of the checkpoint: the stubs write none, so the whole epoch so far).
* mid-epoch resume vs epoch-granular restart (PaddlePaddle's fit-a-line example, 2
  gloo trainers, 20,000 records in 30 KiB tasks, 10 ms per step): the same collective job scaled 2 -> 3 in
  the middle of its first epoch, once checkpointing only at epoch ends and once with
  ``--checkpoint-every 4`` (tasks; see trainer_agent/paddle.py). Measured from the
  example's log of the records its steps consumed: the records of the epoch consumed
  twice (before the restart, and again after it), of those the first group consumed.
  Skipped without paddle.

Each is repeated `--runs` times; the median and the range are printed. What this does NOT
measure: process start-up of a real model (PaddlePaddle's import is ~1 s more per trainer,
and a collective group's rendezvous), nor Kubernetes (pod scheduling and image pulls
dominate there).

    python bench/elastic.py                    # 3 runs of each
    python bench/elastic.py --runs 1 --quick   # a smoke test: half of fit-a-line's data
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from datasets import write_records  # noqa: E402
from trainers import read_log  # noqa: E402

from examples.fit_a_line.consumed import read_entries  # noqa: E402
from paddlecloud.backends.local.job import LocalJob, LocalJobSpec  # noqa: E402

logger = logging.getLogger(__name__)

POLL = 0.01


@dataclass(frozen=True)
class Sizes:
    """How much data the fit-a-line runs read (`--quick`: half, for the smoke test, scaled
    after 500 records: 9,500 left, so the group restart a scale makes comes well before the
    job's end; a loaded box's supervisor reached it ~3,400 records after the scale; the stub
    jobs keep theirs: with less, a job ends before the trainers a scale adds start)."""

    example_rows_per_shard: int = 10_000  # 2 shards, of the fit-a-line runs
    scale_after_consumed: int = 4_000  # records the fit-a-line group consumed before the scale


QUICK = Sizes(example_rows_per_shard=5_000, scale_after_consumed=500)


def _consumed(log: Path, *, first_group: bool = False) -> list[tuple[int, int]]:
    """(epoch, record id) of every record the example's steps consumed, in log order;
    `first_group`: only the first group's (up to the first start after a step)."""
    out = []
    for entry in read_entries(log):
        if first_group and "started" in entry and out:
            break
        out.extend((entry["epoch"], i) for i in entry.get("ids", ()))
    return out


async def resume_run(workdir: Path, *, every: str | None, sizes: Sizes) -> dict[str, float]:
    """The fit-a-line job scaled 2 -> 3 mid-epoch; records of epoch 0 consumed again after it."""
    from examples.fit_a_line.data import generate

    data = workdir / "data"
    generate(data, shards=2, rows=sizes.example_rows_per_shard)
    log = workdir / "consumed.jsonl"
    env = [("FIT_A_LINE_CONSUMED_LOG", str(log))]
    if every:
        env.append(("PADDLECLOUD_CHECKPOINT_EVERY", every))
    spec = LocalJobSpec(
        job=f"bench-resume-{os.getpid()}-{'mid' if every else 'epoch'}", module="examples.fit_a_line.train",
        output=workdir / "out", inputs=(str(data / "*.csv"),), trainers=2, min_trainers=1,
        max_trainers=3, package_path=ROOT, epochs=1, env=tuple(env),
        module_args=("--step-delay", "0.01", "--batch-size", "32"),
        master_args=("--chunk-bytes", "30KiB"), session_ttl="10s",
    )
    job = LocalJob(spec, on_line=lambda who, text: None)
    runner = asyncio.create_task(job.run())
    try:
        await _until(lambda: len(_consumed(log)) >= sizes.scale_after_consumed, timeout=240)
        await job.scale(3)
        await runner
        before = {r for e, r in _consumed(log, first_group=True) if e == 0}
        after = Counter(r for e, r in _consumed(log) if e == 0)
        return {"records before": len(before), "records re-read": sum(1 for r in after if after[r] > 1)}
    finally:
        if not runner.done():
            job.stopping.set()
            await asyncio.gather(runner, return_exceptions=True)


async def _until(condition, *, timeout: float = 120.0) -> float:
    """Seconds until `condition()` held (polled every 10 ms)."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise TimeoutError("the scaled job never reached its new size")
        await asyncio.sleep(POLL)
    return time.monotonic() - started


async def one_run(workdir: Path, *, collective: bool) -> dict[str, float]:
    data = workdir / "data"
    write_records(data, files=8, records_per_file=200)
    log = workdir / "records.tsv"
    spec = LocalJobSpec(
        job=f"bench-elastic-{os.getpid()}-{'c' if collective else 'ps'}", module="trainer_agent.stub",
        output=workdir / "out", inputs=(str(data / "*.csv"),), trainers=2, min_trainers=1,
        max_trainers=4, pservers=0 if collective else 1,
        pserver_module=None if collective else "pserver_agent.stub",
        restart_mode="group" if collective else "trainer", epochs=1,
        env=(("PADDLECLOUD_RECORD_LOG", str(log)),), module_args=("--delay", "0.01"),
        master_args=("--chunk-bytes", "400"), session_ttl="5s",
    )
    job = LocalJob(spec, on_line=lambda who, text: None)
    runner = asyncio.create_task(job.run())
    try:
        await _until(lambda: len(read_log(log)) >= 50 and job.progress.desired_trainers == 2)
        read_before = Counter(r for _, _, _, r in read_log(log))
        scaled = time.monotonic()
        await job.scale(3 if collective else 4)
        new = {"2"} if collective else {"2", "3"}
        await _until(lambda: any(t in new for _, t, _, _ in read_log(log)))
        out = {"first record": time.monotonic() - scaled}
        if collective:
            await runner
            after = Counter(r for _, _, _, r in read_log(log))
            out["records re-read"] = sum(1 for r in read_before if after[r] > 1)
            out["records before"] = len(read_before)
        else:
            def second_task() -> bool:
                tasks = {(t, task) for _, t, task, _ in read_log(log) if t in new}
                return any(sum(1 for who, _ in tasks if who == t) >= 2 for t in new)
            await _until(second_task)
            out["first task finished"] = time.monotonic() - scaled
            await runner
        return out
    finally:
        if not runner.done():
            job.stopping.set()
            await asyncio.gather(runner, return_exceptions=True)


def _summary(values: list[float], unit: str, digits: int = 2) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}{unit}"
    return (f"{statistics.median(values):.{digits}f}{unit} "
            f"(range {min(values):.{digits}f}-{max(values):.{digits}f})")


async def run(runs: int, sizes: Sizes) -> None:
    results: dict[str, list[dict[str, float]]] = {"ps": [], "collective": [], "epoch": [], "mid": []}
    paddle = importlib.util.find_spec("paddle") is not None
    for _ in range(runs):
        for kind in ("ps", "collective"):
            with tempfile.TemporaryDirectory(prefix=f"bench-elastic-{kind}-") as tmp:
                results[kind].append(await one_run(Path(tmp), collective=kind == "collective"))
        for kind, every in (("epoch", None), ("mid", "4")) if paddle else ():
            with tempfile.TemporaryDirectory(prefix=f"bench-elastic-{kind}-") as tmp:
                results[kind].append(await resume_run(Path(tmp), every=every, sizes=sizes))
    ps, coll = results["ps"], results["collective"]
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs, {runs} run(s) each"
          + (" (--quick: half of fit-a-line's data)" if sizes == QUICK else ""))
    print("| what | from ScaleTrainers |")
    print("| --- | --- |")
    print(f"| PS 2 -> 4: first record read by a new trainer | {_summary([r['first record'] for r in ps], ' s')} |")
    print(f"| PS 2 -> 4: first task finished by a new trainer | "
          f"{_summary([r['first task finished'] for r in ps], ' s')} |")
    print(f"| collective 2 -> 3 (group restart): first record read by the new group | "
          f"{_summary([r['first record'] for r in coll], ' s')} |")
    print(f"| collective: records of the epoch read again after the restart (epoch-granular) | "
          f"{_summary([r['records re-read'] for r in coll], '', 0)} of "
          f"{_summary([r['records before'] for r in coll], '', 0)} read before it |")
    if not paddle:
        print("(no paddle: the resume rows are skipped)")
        return
    for kind, what in (("epoch", "epoch-granular restart"), ("mid", "mid-epoch resume, --checkpoint-every 4")):
        rows = results[kind]
        print(f"| fit-a-line 2 -> 3 mid-epoch, {what}: records consumed again | "
              f"{_summary([r['records re-read'] for r in rows], '', 0)} of "
              f"{_summary([r['records before'] for r in rows], '', 0)} consumed before it |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="half of the data (a smoke test)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: must be at least 1")
    asyncio.run(run(args.runs, QUICK if args.quick else Sizes()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
