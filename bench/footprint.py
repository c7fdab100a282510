"""etcd footprint of a job: keys and bytes per task mid-epoch, and what 100 epochs leave behind.

    python bench/footprint.py            # the full run (about 1-2 minutes)
    python bench/footprint.py --quick    # a reduced run for a smoke test (< 60 s)

What runs: etcd as paddlecloud starts it (`EtcdServer`: --auto-compaction-mode revision
--auto-compaction-retention 100000, data dir on a real disk, fsync on), one `paddlecloud
master` per job (default flags + --input <sparse file> --chunk-bytes 1: one byte = one task),
and N asyncio trainers in this process over real gRPC, looping GetTask with the previous task
piggybacked as finished, as fast as they can.

1. Mid-epoch: a job of T tasks runs its epoch 0, then half of epoch 1; the trainers stop
   (each still holding the task it got last) and every key under the job's prefix is read at
   one revision: keys and bytes (key + value) by kind, per task.
2. Growth: a small job (200 tasks x 100 epochs) runs to its end. At each epoch's end (a watch
   on the `epoch` key) the job's keys are read again, and etcd's Maintenance Status gives the
   db file size, the part of it in use, and the revision. Keys must stay bounded: an epoch's
   done marks are deleted when it ends. etcd keeps every revision until a compaction, so the
   db grows; at the end the bench compacts to the current revision and defragments, and shows
   what each step gives back.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    Master,
    machine_lines,
    refuse_tmpfs,
    sparse_file,
    start_etcd,
    table,
)

RETENTION = 100_000          # --auto-compaction-retention of paddlecloud's EtcdServer (revisions)
QUOTA = 2 * 1024**3          # etcd's default --quota-backend-bytes
CAP = 2                      # --max-tasks-per-trainer default
PLATEAU_RATES = (1.0, 0.3, 0.1, 0.05)  # revisions per task: 1 trainer ... large group-commit batches


# ---- etcd reads ---------------------------------------------------------------------


async def job_keys(client, job: str) -> dict:
    """Every key of the job at one revision: counts and bytes by kind, done marks by epoch."""
    from paddlecloud.etcd import read_range
    from paddlecloud.keys import JobKeys, prefix_range_end
    prefix = JobKeys("local", job).prefix
    kvs, revision = await read_range(client, prefix, prefix_range_end(prefix))
    kinds: dict[str, dict[str, int]] = {}
    done_epochs: Counter = Counter()
    epoch = None
    for kv in kvs:
        rest = kv.key[len(prefix):].decode()
        kind = rest.split("/", 1)[0]
        k = kinds.setdefault(kind, {"keys": 0, "key_bytes": 0, "value_bytes": 0})
        k["keys"] += 1
        k["key_bytes"] += len(kv.key)
        k["value_bytes"] += len(kv.value)
        if kind == "done":
            done_epochs[int(rest.split("/")[1])] += 1
        elif kind == "epoch":
            epoch = int(kv.value)
    return {"revision": revision, "epoch": epoch, "kinds": kinds,
            "keys": sum(k["keys"] for k in kinds.values()),
            "bytes": sum(k["key_bytes"] + k["value_bytes"] for k in kinds.values()),
            "done_by_epoch": {str(e): n for e, n in sorted(done_epochs.items())}}


async def db_status(client) -> dict:
    """etcd's Maintenance Status: db file size, the part in use (etcd >= 3.4), revision."""
    from aetcd import rpc
    await client.connect()
    reply = await client.maintenancestub.Status(rpc.StatusRequest(), timeout=30, metadata=client.metadata)
    return {"db_size": reply.dbSize, "db_in_use": reply.dbSizeInUse, "revision": reply.header.revision,
            "raft_index": reply.raftIndex}


# ---- trainers -----------------------------------------------------------------------


class Trainers:
    """N trainers, each the client trainer_agent runs (`paddlecloud.master_client`: a
    connection, a session, its task stream), looping GetTask + piggybacked finish."""

    def __init__(self, target: str, n: int, prefix: str) -> None:
        import grpc

        from paddlecloud.auth import ClientCredentials
        from paddlecloud.master_client import MasterConnection, MasterLocator, Session
        locator = MasterLocator(master_endpoint=target)
        self.connections = [MasterConnection(locator, deadline=60, credentials=ClientCredentials(),
                                             observe=self._failed) for _ in range(n)]
        self.sessions = [Session(c, trainer_id=f"{prefix}{i}") for i, c in enumerate(self.connections)]
        self.n = n
        self.accepted: Counter = Counter()   # epoch -> finishes ACCEPTED
        self.errors: Counter = Counter()
        self.stop_when = None                # callable(): stop, holding a task, before the next call
        self._grpc = grpc

    def _failed(self, error: BaseException) -> None:
        """Every failed attempt a connection retries, by its code."""
        self.errors[error.code().name if isinstance(error, self._grpc.RpcError) else type(error).__name__] += 1

    async def trainer(self, i: int) -> None:
        from paddlecloud.api import pb
        from paddlecloud.wire import seconds
        connection, session = self.connections[i], self.sessions[i]
        epoch = (await session.register()).current_epoch
        previous: list = []
        while True:
            if previous and self.stop_when is not None and self.stop_when():
                return  # holding the task it got last: its assignment stays in etcd
            reply = await session.run(lambda s, acks=previous, epoch=epoch: connection.get_task(
                s, epoch=epoch, finished=acks))
            for ref, result in zip(previous, reply.finished_results, strict=False):
                if result == pb.ACCEPTED:
                    self.accepted[ref.epoch] += 1
            previous = []
            if reply.outcome == pb.TASK:
                t = reply.task
                previous = [pb.TaskRef(task_id=t.id, epoch=t.epoch, attempt=t.attempt)]
            elif reply.outcome == pb.WAIT:
                await asyncio.sleep(seconds(reply.retry_after) * random.uniform(0.5, 1.5))
            elif reply.outcome == pb.EPOCH_DONE:
                epoch = reply.current_epoch
            else:
                return

    async def run(self) -> None:
        await asyncio.gather(*(self.trainer(i) for i in range(self.n)))

    async def close(self) -> None:
        for session in self.sessions:
            session.close()
        await asyncio.gather(*(c.close() for c in self.connections))


# ---- the two parts ------------------------------------------------------------------


async def mid_epoch(args, etcd_endpoint: str, work: Path) -> dict:
    from paddlecloud import etcd
    job = f"footprint-mid-{id(args) % 100000}"
    data = sparse_file(work / f"{job}.dat", args.mid_tasks)
    master = Master(job=job, etcd=etcd_endpoint, log_dir=work,
                    args=["--input", str(data), "--chunk-bytes", "1", "--epochs", "2"]).start()
    client = await etcd.connect(etcd_endpoint)
    trainers = Trainers(master.address, args.trainers, "mid-")
    try:
        await asyncio.to_thread(master.wait_serving)
        half = args.mid_tasks // 2
        trainers.stop_when = lambda: trainers.accepted[1] >= half
        await asyncio.wait_for(trainers.run(), 600)
        snap = await job_keys(client, job)
    finally:
        await trainers.close()
        master.stop()
        await client.close()
    kinds = snap["kinds"]

    def per_key(kind: str) -> float:
        k = kinds.get(kind)
        return (k["key_bytes"] + k["value_bytes"]) / k["keys"] if k else 0.0
    done = kinds.get("done", {}).get("keys", 0)
    pending = kinds.get("assign", {}).get("keys", 0)
    fixed_kinds = [k for k in kinds if k not in ("done", "assign", "failures", "trainers", "superseded")]
    fixed_bytes = sum(kinds[k]["key_bytes"] + kinds[k]["value_bytes"] for k in fixed_kinds)
    return {
        "tasks": args.mid_tasks, "trainers": args.trainers, "snapshot": snap,
        "done_marks": done, "assignments": pending,
        "done_mark_bytes": per_key("done"), "assignment_bytes": per_key("assign"),
        "trainer_key_bytes": per_key("trainers"), "fixed_bytes": fixed_bytes, "fixed_kinds": fixed_kinds,
        "keys_per_task": snap["keys"] / args.mid_tasks, "bytes_per_task": snap["bytes"] / args.mid_tasks,
        "accepted_epoch1": trainers.accepted[1],
    }


async def growth(args, etcd_endpoint: str, work: Path) -> dict:
    from paddlecloud import etcd
    from paddlecloud.keys import JobKeys
    job = f"footprint-growth-{id(args) % 100000}"
    data = sparse_file(work / f"{job}.dat", args.tasks)
    master = Master(job=job, etcd=etcd_endpoint, log_dir=work,
                    args=["--input", str(data), "--chunk-bytes", "1", "--epochs", str(args.epochs)]).start()
    client = await etcd.connect(etcd_endpoint)
    watcher = await etcd.connect(etcd_endpoint)
    trainers = Trainers(master.address, args.trainers, "grow-")
    ends: list[dict] = []
    try:
        await asyncio.to_thread(master.wait_serving)
        start_status = await db_status(client)
        start_keys = await job_keys(client, job)
        watch = await watcher.watch(JobKeys("local", job).epoch, start_revision=start_status["revision"] + 1)

        async def observe() -> None:
            async for event in watch:
                if event.kind != "PUT":
                    continue
                ended = int(event.kv.value) - 1
                if ended < 0:
                    continue
                keys = await job_keys(client, job)
                status = await db_status(client)
                old_done = sum(n for e, n in keys["done_by_epoch"].items() if int(e) < (keys["epoch"] or 0))
                ends.append({"ended": ended, "t": time.monotonic(), "keys": keys["keys"], "bytes": keys["bytes"],
                             "epoch_now": keys["epoch"], "done_old_epochs": old_done,
                             "kinds": {k: v["keys"] for k, v in keys["kinds"].items()}, **status})
                if ended + 1 >= args.epochs:
                    return

        observer = asyncio.create_task(observe())
        started = time.monotonic()
        await asyncio.wait_for(trainers.run(), 1800)
        elapsed = time.monotonic() - started
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(observer, 30)
        observer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watch.cancel()
        end_keys = await job_keys(client, job)
        before = await db_status(client)
        await client.compact(before["revision"], physical=True)
        compacted = await db_status(client)
        await client.defragment()
        defragged = await db_status(client)
    finally:
        await trainers.close()
        master.stop()
        await client.close()
        await watcher.close()
    tasks_done = sum(trainers.accepted.values())
    revisions = before["revision"] - start_status["revision"]
    history = before["db_in_use"] - start_status["db_in_use"]
    bound = args.tasks + args.trainers * CAP + args.trainers + 8  # done + assign + trainers + fixed keys
    keys = [e["keys"] for e in ends]
    half = ends[len(ends) // 2:] if len(ends) >= 4 else ends
    slope = 0.0
    if len(half) >= 2 and half[-1]["ended"] != half[0]["ended"]:
        slope = (half[-1]["db_size"] - half[0]["db_size"]) / (half[-1]["ended"] - half[0]["ended"])
    rev_per_task = revisions / tasks_done if tasks_done else float("nan")
    history_per_rev = history / revisions if revisions else float("nan")
    return {
        "tasks": args.tasks, "epochs": args.epochs, "trainers": args.trainers, "elapsed_s": elapsed,
        "tasks_done": tasks_done, "errors": dict(trainers.errors), "epoch_ends": ends,
        "epoch_ends_seen": len(ends), "start_keys": start_keys["keys"], "end_keys": end_keys["keys"],
        "end_kinds": {k: v["keys"] for k, v in end_keys["kinds"].items()},
        "keys_min": min(keys) if keys else None, "keys_max": max(keys) if keys else None,
        "keys_median": statistics.median(keys) if keys else None, "bound": bound,
        "old_done_max": max((e["done_old_epochs"] for e in ends), default=0),
        "bounded": bool(keys) and max(keys) <= bound and max(e["done_old_epochs"] for e in ends) == 0,
        "db_start": start_status, "db_end": before, "db_compacted": compacted, "db_defragged": defragged,
        "revisions": revisions, "revisions_per_task": rev_per_task,
        "history_bytes_per_revision": history_per_rev,
        "history_bytes_per_task": history / tasks_done if tasks_done else float("nan"),
        "db_growth_per_epoch": slope,
        "plateau_estimate_bytes": RETENTION * history_per_rev + compacted["db_in_use"],
        "plateau_by_revisions_per_task": {str(r): RETENTION / r * history / tasks_done if tasks_done else None
                                          for r in PLATEAU_RATES},
        "retention": RETENTION, "quota": QUOTA,
    }


# ---- output -------------------------------------------------------------------------


def mib(x: float) -> str:
    return f"{x / 2**20:.1f} MiB"


def report(results: dict, say) -> None:
    m, g = results["mid"], results["growth"]
    say()
    snap = m["snapshot"]
    say(f"Mid-epoch: {m['tasks']:,} tasks, {m['trainers']} trainers, stopped half-way through epoch 1 "
        f"({m['accepted_epoch1']:,} tasks done in it); every key under the job's prefix, at revision "
        f"{snap['revision']:,}")
    rows = []
    for kind, k in sorted(snap["kinds"].items(), key=lambda kv: -kv[1]["keys"]):
        rows.append([kind, f"{k['keys']:,}", f"{k['key_bytes']:,}", f"{k['value_bytes']:,}",
                     f"{(k['key_bytes'] + k['value_bytes']) / k['keys']:.0f}"])
    rows.append(["all", f"{snap['keys']:,}", f"{sum(k['key_bytes'] for k in snap['kinds'].values()):,}",
                 f"{sum(k['value_bytes'] for k in snap['kinds'].values()):,}",
                 f"{snap['bytes'] / snap['keys']:.0f}"])
    for line in table(["kind", "keys", "key bytes", "value bytes", "bytes/key"], rows):
        say(line)
    say(f"  done marks of epoch 0 left: {sum(n for e, n in snap['done_by_epoch'].items() if int(e) < 1)}; "
        f"per task (all keys / tasks): {m['keys_per_task']:.2f} keys, {m['bytes_per_task']:.0f} bytes")
    say(f"  a done mark costs {m['done_mark_bytes']:.0f} bytes, a live assignment {m['assignment_bytes']:.0f}, "
        f"a trainer {m['trainer_key_bytes']:.0f}; job-wide keys ({', '.join(m['fixed_kinds'])}) "
        f"{m['fixed_bytes']:,} bytes")
    say(f"  so at an epoch's end (every task done, nothing pending) a job of T tasks holds about "
        f"T x {m['done_mark_bytes']:.0f} bytes + {m['fixed_bytes']:,}: "
        f"{mib(1_000_000 * m['done_mark_bytes'] + m['fixed_bytes'])} for 1,000,000 tasks")

    say()
    say(f"Growth: {g['tasks']} tasks x {g['epochs']} epochs, {g['trainers']} trainers, "
        f"{g['tasks_done']:,} tasks done in {g['elapsed_s']:.1f} s; {g['epoch_ends_seen']} epoch ends seen")
    ends = g["epoch_ends"]
    picks = sorted({0, 1, len(ends) // 4, len(ends) // 2, 3 * len(ends) // 4, len(ends) - 1})
    rows = []
    for i in picks:
        if 0 <= i < len(ends):
            e = ends[i]
            rows.append([str(e["ended"]), f"{e['keys']:,}", f"{e['bytes']:,}", str(e["done_old_epochs"]),
                         f"{e['revision']:,}", mib(e["db_size"]), mib(e["db_in_use"])])
    for line in table(["epoch ended", "keys", "bytes", "done marks of older epochs", "revision",
                       "db size", "db in use"], rows):
        say(line)
    say(f"  keys under the prefix at the {len(ends)} epoch ends: min {g['keys_min']}, median "
        f"{g['keys_median']:.0f}, max {g['keys_max']} (bound: {g['tasks']} done + {g['trainers']}x{CAP} "
        f"assignments + {g['trainers']} trainers + job-wide = {g['bound']}); done marks of older epochs: "
        f"max {g['old_done_max']}; after the job: {g['end_keys']} keys")
    say(f"  etcd history: {g['revisions']:,} revisions for {g['tasks_done']:,} tasks "
        f"({g['revisions_per_task']:.2f} per task: one per group-commit batch); db in use grew "
        f"{g['history_bytes_per_task']:.0f} bytes per task ({g['history_bytes_per_revision']:.0f} per revision); "
        f"db file {mib(g['db_start']['db_size'])} -> {mib(g['db_end']['db_size'])}, "
        f"{g['db_growth_per_epoch'] / 1024:.1f} KiB per epoch over the second half")
    say(f"  compaction to the current revision: db in use {mib(g['db_end']['db_in_use'])} -> "
        f"{mib(g['db_compacted']['db_in_use'])}, file stays {mib(g['db_compacted']['db_size'])}; "
        f"defragment: file {mib(g['db_defragged']['db_size'])}")
    per_task = g["history_bytes_per_task"]
    say(f"  --auto-compaction-retention {RETENTION:,} (revision mode: every 5 minutes etcd compacts to the latest "
        f"revision - {RETENTION:,}) keeps {RETENTION:,} revisions of history: at this run's "
        f"{g['revisions_per_task']:.2f} revisions per task that is {RETENTION / g['revisions_per_task']:,.0f} tasks, "
        f"{mib(g['plateau_estimate_bytes'])}")
    say("  the same by revisions per task (fewer under load: one revision per group-commit batch): "
        + ", ".join(f"{r:g} -> {mib(RETENTION / r * per_task)}" for r in PLATEAU_RATES)
        + f"; plus up to 5 minutes of writes between two compactions; etcd's default quota is {mib(QUOTA)}")

    say()
    say("Goals" + ("  [--quick: sizes reduced, not a verdict]" if results["args"]["quick"] else ""))
    say(f"  keys bounded over {g['epochs']} epochs (<= {g['bound']} at every epoch end, no old done marks): "
        f"max {g['keys_max']}, old done marks {g['old_done_max']}  {'met' if g['bounded'] else 'MISSED'}")


def run(args: argparse.Namespace) -> int:
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    refuse_tmpfs(args.dir, args.allow_tmpfs)
    work = Path(tempfile.mkdtemp(prefix="paddlecloud-footprint-", dir=args.dir))
    server = None

    def say(line: str = "") -> None:
        print(line, flush=True)

    try:
        server = start_etcd(work / "etcd")
        say("paddlecloud etcd footprint benchmark" + ("  (--quick: reduced, not for figures)" if args.quick else ""))
        head = machine_lines(str(work / "etcd"))
        for line in head:
            say(line)
        say("master: `paddlecloud master` default flags + --input <sparse file> --chunk-bytes 1 --epochs E")

        async def both() -> dict:
            return {"mid": await mid_epoch(args, server.endpoint, work),
                    "growth": await growth(args, server.endpoint, work)}
        results = asyncio.run(both())
        results["args"] = vars(args)
        results["header"] = head
        report(results, say)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        return 0
    finally:
        if server is not None:
            server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/footprint.py",
                                     description="etcd keys and bytes per task, and growth over many epochs.")
    parser.add_argument("--quick", action="store_true", help="reduced run for a smoke test (< 60 s)")
    parser.add_argument("--mid-tasks", type=int, help="tasks of the mid-epoch job [2000; --quick 200]")
    parser.add_argument("--tasks", type=int, help="tasks per epoch of the growth job [200; --quick 50]")
    parser.add_argument("--epochs", type=int, help="epochs of the growth job [100; --quick 10]")
    parser.add_argument("--trainers", type=int, default=8, help="trainers [8]")
    parser.add_argument("--dir", default="/var/tmp", help="where the etcd data dir goes: a real disk [/var/tmp]")
    parser.add_argument("--allow-tmpfs", action="store_true",
                        help="run even if --dir is on tmpfs (smoke tests only)")
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, etcd data)")
    args = parser.parse_args(argv)
    args.mid_tasks = args.mid_tasks or (200 if args.quick else 2000)
    args.tasks = args.tasks or (50 if args.quick else 200)
    args.epochs = args.epochs or (10 if args.quick else 100)
    return args


def main(argv: list[str] | None = None) -> int:
    return run(parse(argv))


if __name__ == "__main__":
    sys.exit(main())
