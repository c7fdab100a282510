"""Elastic jobs: how long from `ScaleTrainers` to the new size training, PS and collective, in one run.

Two local jobs (`paddlecloud.local.job.LocalJob`: a private etcd, a master, stub trainers
that read and log records) are scaled while they run:

* PS-shaped (a stub pserver, trainers join and leave): 2 -> 4 trainers. Measured: from the
  ScaleTrainers call to the first record read by a new trainer (id 2 or 3), and to the
  first task it finished (its first record of a second task: the stub reports a task
  finished with its next GetTask).
* collective-shaped (group restarts): 2 -> 3 trainers. Measured: from the ScaleTrainers
  call to the first record read by the restarted group (trainer id 2 exists only there),
  and the records of the epoch read again after the restart (the group restarts the
  epoch of the checkpoint: the stubs write none, so the whole epoch so far).

Each is repeated `--runs` times; the median and the range are printed. What this does NOT
measure: process start-up of a real model (PaddlePaddle's import is ~1 s more per trainer,
and a collective group's rendezvous), nor Kubernetes (pod scheduling and image pulls
dominate there).

    python bench/elastic.py            # 3 runs of each
    python bench/elastic.py --runs 1   # a smoke test
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from datasets import write_records  # noqa: E402

from paddlecloud.local.job import LocalJob, LocalJobSpec  # noqa: E402

logger = logging.getLogger(__name__)

POLL = 0.01


def _rows(path: Path) -> list[tuple[int, str, int, str]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().split("\n"):
        parts = line.split("\t")
        if len(parts) == 4:
            rows.append((int(parts[0]), parts[1], int(parts[2]), parts[3]))
    return rows


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
        await _until(lambda: len(_rows(log)) >= 50 and job.progress.desired_trainers == 2)
        read_before = Counter(r for _, _, _, r in _rows(log))
        scaled = time.monotonic()
        await job.scale(3 if collective else 4)
        new = {"2"} if collective else {"2", "3"}
        await _until(lambda: any(t in new for _, t, _, _ in _rows(log)))
        out = {"first record": time.monotonic() - scaled}
        if collective:
            await runner
            after = Counter(r for _, _, _, r in _rows(log))
            out["records re-read"] = sum(1 for r in read_before if after[r] > 1)
            out["records before"] = len(read_before)
        else:
            def second_task() -> bool:
                tasks = {(t, task) for _, t, task, _ in _rows(log) if t in new}
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


async def run(runs: int) -> None:
    results: dict[str, list[dict[str, float]]] = {"ps": [], "collective": []}
    for _ in range(runs):
        for kind in ("ps", "collective"):
            with tempfile.TemporaryDirectory(prefix=f"bench-elastic-{kind}-") as tmp:
                results[kind].append(await one_run(Path(tmp), collective=kind == "collective"))
    ps, coll = results["ps"], results["collective"]
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs, {runs} run(s) each")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: must be at least 1")
    asyncio.run(run(args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
