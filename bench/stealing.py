"""Work stealing: the epoch time of a job with one trainer slowed 5x, with and without it.

    python bench/stealing.py [--quick] [--trainers 3] [--slowdown 5] [--files 6] [--records 200]

One etcd, then two jobs on the same data, side by side in one run: a master with work
stealing (the default) and one with `--no-work-stealing`, each with N stub trainers
(`python -m trainer_agent.stub`) of which one sleeps `slowdown` times longer per record
than the others. The epoch time is the wall time from the trainers' start until the
last one exits (one epoch). Each run's record log is checked: every record read exactly
once. Printed: what ran, on which machine, the two times, their ratio, the splits.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from common import Master, machine_lines, start_etcd, table  # noqa: E402  (common puts ROOT on sys.path)


def write_data(directory: Path, files: int, records: int) -> set[str]:
    directory.mkdir(parents=True, exist_ok=True)
    expected = set()
    for f in range(files):
        lines = [f"{f}-{i:05d},payload" for i in range(records)]
        expected.update(lines)
        (directory / f"part-{f:03d}.csv").write_text("".join(f"{line}\n" for line in lines))
    return expected


def run_job(*, etcd: str, job: str, data: Path, work: Path, args: argparse.Namespace,
            stealing: bool) -> dict:
    from paddlecloud.api import pb, pb_grpc

    flags = ["--input", str(data / "*.csv"), "--session-ttl", args.session_ttl]
    if not stealing:
        flags.append("--no-work-stealing")
    master = Master(job=job, etcd=etcd, log_dir=work, args=flags).start()
    master.wait_serving()
    log = work / f"{job}.tsv"
    trainers = []
    started = time.perf_counter()
    try:
        for n in range(args.trainers):
            delay = args.delay * (args.slowdown if n == 0 else 1)
            env = dict(os.environ, PADDLE_TRAINER_ID=f"{'slow' if n == 0 else 'fast'}-{n}",
                       PADDLE_MASTER_ENDPOINT=master.address, PYTHONUNBUFFERED="1")
            with open(work / f"{job}-trainer-{n}.out", "wb") as out:
                trainers.append(subprocess.Popen(
                    [sys.executable, "-m", "trainer_agent.stub", "--log", str(log), "--delay", str(delay)],
                    stdout=out, stderr=subprocess.STDOUT, env=env))
        codes = [t.wait(timeout=args.timeout) for t in trainers]
        elapsed = time.perf_counter() - started
        import grpc
        with grpc.insecure_channel(master.address) as channel:
            status = pb_grpc.MasterStub(channel).GetStatus(pb.GetStatusRequest(), timeout=10)
    finally:
        for t in trainers:
            if t.poll() is None:
                t.kill()
        master.stop()
    reads = Counter(line.split("\t")[3] for line in log.read_text().splitlines() if line.count("\t") == 3)
    return {"seconds": elapsed, "codes": codes, "splits": status.splits, "reads": reads}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainers", type=int, default=3)
    parser.add_argument("--slowdown", type=float, default=5.0, help="the slow trainer's per-record delay, x")
    parser.add_argument("--delay", type=float, default=0.005, help="seconds per record of a fast trainer")
    parser.add_argument("--files", type=int, default=6, help="input files (one task each)")
    parser.add_argument("--records", type=int, default=400, help="records per file")
    parser.add_argument("--session-ttl", default="30s", help="the masters' --session-ttl (the default)")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--quick", action="store_true", help="a small run, for the smoke test")
    args = parser.parse_args()
    if args.quick:
        args.files, args.records, args.delay = 4, 60, 0.01
    with tempfile.TemporaryDirectory(prefix="bench-stealing-") as tmp:
        work = Path(tmp)
        expected = write_data(work / "data", args.files, args.records)
        print("bench/stealing.py: epoch time with one trainer slowed, with and without work stealing")
        for line in machine_lines(str(work)):
            print(line)
        print(f"ran: {args.trainers} stub trainers, one slowed {args.slowdown:g}x ({args.delay * args.slowdown:g} s "
              f"per record against {args.delay:g} s); {args.files} files x {args.records} records "
              f"(one task per file); 1 epoch; --session-ttl {args.session_ttl}")
        etcd = start_etcd(work / "etcd")
        try:
            results = {name: run_job(etcd=etcd.endpoint, job=f"steal-{n}", data=work / "data", work=work,
                                     args=args, stealing=(name == "with stealing"))
                       for n, name in enumerate(("with stealing", "without"))}
        finally:
            etcd.stop()
        rows = []
        for name, r in results.items():
            once = set(r["reads"]) == expected and set(r["reads"].values()) == {1}
            rows.append([name, f"{r['seconds']:.1f} s", str(r["splits"]), str(once), str(r["codes"])])
        for line in table(["mode", "epoch time", "splits", "exactly once", "trainer exits"], rows):
            print(line)
        ratio = results["without"]["seconds"] / results["with stealing"]["seconds"]
        print(f"epoch time without / with stealing: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
