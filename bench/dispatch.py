"""Dispatch benchmark of the master: finished tasks/s against a real, fsynced etcd, side by side
with a no-op gRPC service (the ceiling of this machine), in one run.

    python bench/dispatch.py            # the full run (about 2-3 minutes)
    python bench/dispatch.py --quick    # a reduced run for a smoke test (< 60 s)

What runs, each in its own process:
  * etcd (`paddlecloud.etcd_server.EtcdServer`, the flags paddlecloud starts it with, data
    dir on a real disk: tmpfs is refused, no --unsafe-no-fsync: every commit is fsynced);
  * `paddlecloud master` with default flags plus the dataset, `--chunk-bytes 1` (so one
    byte of a sparse file is one chunk, one task) and `--metrics-port`;
  * a no-op gRPC server (`--role noop`) that answers GetTask (and each message of a
    GetTaskStream, for bench/scale.py) with a prebuilt GetTaskResponse of the same shape
    and size as the master's, on the master's event loop (`paddlecloud.aio.run`: uvloop);
  * one client process (`--role client`) running N asyncio trainers over real gRPC,
    one channel (TCP connection) each, as separate trainer processes would have. Each
    trainer is the client trainer_agent runs (`paddlecloud.master_client`: a connection, a
    session, its task stream): it registers once, then loops GetTask with the previous
    task piggybacked in `finished`; on WAIT it sleeps retry_after x U(0.5, 1.5); on
    EPOCH_DONE it moves on. The same client runs against the master and the no-op server,
    so the ratio compares the servers. One client process, not several: the box has 2
    cores; a second client process would take CPU from the master and etcd, not add any.

The client measures a window (after a warm-up): finished tasks/s (finishes the master
answered ACCEPTED), GetTask latency as the trainer sees it, and, from the master's
Prometheus metrics, etcd transactions (group-commit batches) per finished task, plus the
CPU each process used in the window. Speed goals live here, never in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/dispatch.py` from a checkout
    sys.path.insert(0, str(ROOT))

from common import (  # noqa: E402  (after the sys.path line above)
    cpu_model,
    cpu_seconds,
    etcd_version,
    fdatasync_ms,
    filesystem_of,
    free_port,
    free_ports,
    machine_busy_seconds,
    percentile,
    register_all,
    rss_mb,
    scrape,
    sparse_file,
)

TARGETS = {
    "rate_64": 2000.0,          # finished tasks/s at 64 trainers
    "ceiling_share": 0.50,      # of the no-op calls/s in the same run
    "p99_ms": 25.0,
    "start_s": 10.0,            # 1M-chunk dataset, start to SERVING
    "rss_mb": 500.0,
    "big_vs_small": 0.80,       # dispatch at 1M chunks / at 1,000 chunks
}


# ---- the no-op server (its own process) ---------------------------------------------


def run_noop(config: dict) -> None:
    import grpc

    from paddlecloud import aio
    from paddlecloud.api import pb, pb_grpc

    task = pb.Task(id=config["task_id"], epoch=0, attempt=config["attempt"], format="lines",
                   chunks=[pb.Chunk(path=config["path"], begin=config["task_id"],
                                    end=config["task_id"] + 1)])
    plain = pb.GetTaskResponse(outcome=pb.TASK, task=task, current_epoch=0)
    acked = pb.GetTaskResponse(outcome=pb.TASK, task=task, current_epoch=0,
                               finished_results=[pb.ACCEPTED])
    registered = pb.RegisterTrainerResponse(session_id=1, current_epoch=0, num_epochs=1)
    registered.ttl.seconds = 10

    class Noop(pb_grpc.MasterServicer):
        async def RegisterTrainer(self, request, context):
            return registered

        async def GetTask(self, request, context):
            return acked if request.finished else plain

        async def GetTaskStream(self, requests, context):
            if not config.get("streams", True):  # as a master with --no-task-streams
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, "GetTaskStream is off (--unary)")
            async for request in requests:
                yield acked if request.finished else plain

    async def serve() -> None:
        options = [("grpc.so_reuseport", 0), *map(tuple, config.get("options", []))]
        server = grpc.aio.server(options=options)
        pb_grpc.add_MasterServicer_to_server(Noop(), server)
        server.add_insecure_port(f"127.0.0.1:{config['port']}")
        await server.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print("ready", flush=True)
        await stop.wait()
        await server.stop(grace=0.5)

    aio.run(serve())  # the master's event loop (uvloop): the ceiling runs on what the master does


# ---- the client: N simulated trainers (its own process) -----------------------------


def run_client(config: dict) -> None:
    print(json.dumps(asyncio.run(_client(config))), flush=True)


async def _client(config: dict) -> dict:
    """N trainers, each a real `paddlecloud.master_client` connection and session (the code
    trainer_agent runs: its task stream, retries and re-registration), on one event loop."""
    import grpc

    from paddlecloud.api import pb
    from paddlecloud.auth import ClientCredentials
    from paddlecloud.master_client import MasterConnection, MasterLocator, Session
    from paddlecloud.wire import seconds

    n, target = config["n"], config["target"]
    options = [("grpc.use_local_subchannel_pool", 1)]  # one TCP connection per trainer
    errors: dict[str, int] = {}

    def error(problem: BaseException) -> None:
        """Every failed attempt a connection retries, by its code."""
        kind = problem.code().name if isinstance(problem, grpc.RpcError) else type(problem).__name__
        errors[kind] = errors.get(kind, 0) + 1

    locator = MasterLocator(master_endpoint=target)
    connections = [MasterConnection(locator, deadline=60, credentials=ClientCredentials(), observe=error,
                                    open_channel=lambda address: grpc.aio.insecure_channel(address, options=options))
                   for _ in range(n)]
    sessions = [Session(connections[i], trainer_id=f"{config['prefix']}{i}") for i in range(n)]
    register_s = await register_all(sessions, at_once=16)

    loop = asyncio.get_running_loop()
    begin = time.perf_counter()
    warm_end = begin + config["warmup"]
    end = warm_end + config["duration"]
    latencies: list[float] = []
    counts = {"calls": 0, "accepted": 0, "stale": 0, "task": 0, "wait": 0, "epoch_done": 0,
              "job_done": 0}
    sizes: list[int] = []

    async def trainer(i: int) -> None:
        connection, session, epoch, previous = connections[i], sessions[i], 0, []
        while True:
            sent = time.perf_counter()
            if sent >= end:
                return
            acks = previous
            reply = await session.run(
                lambda s, acks=acks, epoch=epoch: connection.get_task(s, epoch=epoch, finished=acks))
            received = time.perf_counter()
            measured = warm_end <= received <= end
            if measured:
                latencies.append(received - sent)
                counts["calls"] += 1
                for result in reply.finished_results:
                    counts["accepted" if result == pb.ACCEPTED else "stale"] += 1
            previous = []
            outcome = reply.outcome
            if outcome == pb.TASK:
                task = reply.task
                previous = [pb.TaskRef(task_id=task.id, epoch=task.epoch, attempt=task.attempt)]
                if measured:
                    counts["task"] += 1
                    if len(sizes) < 200:
                        sizes.append(reply.ByteSize())
            elif outcome == pb.EPOCH_DONE:
                epoch = reply.current_epoch
                counts["epoch_done"] += measured
            elif outcome == pb.WAIT:
                counts["wait"] += measured
                retry = seconds(reply.retry_after)
                await asyncio.sleep(retry * random.uniform(0.5, 1.5))
            else:
                counts["job_done"] += measured
                return

    pids = config.get("pids", {})

    def sample() -> dict:
        busy, steal = machine_busy_seconds()
        found = {"t": time.perf_counter(), "cpu": {k: cpu_seconds(p) for k, p in pids.items()},
                 "busy": busy, "steal": steal}
        found["cpu"]["client"] = cpu_seconds(os.getpid())
        return found

    async def sampler() -> tuple[dict, dict, dict, dict]:
        await asyncio.sleep(max(0.0, warm_end - time.perf_counter()))
        first = sample()
        m0 = await asyncio.to_thread(scrape, config["metrics"]) if config.get("metrics") else {}
        await asyncio.sleep(max(0.0, end - time.perf_counter()))
        last = sample()
        m1 = await asyncio.to_thread(scrape, config["metrics"]) if config.get("metrics") else {}
        return first, last, m0, m1

    watcher = loop.create_task(sampler())
    workers = [loop.create_task(trainer(i)) for i in range(n)]
    first, last, m0, m1 = await watcher
    done, late = await asyncio.wait(workers, timeout=10)
    for task in late:
        task.cancel()
    for task in done:
        if task.exception() is not None:
            error(task.exception())
    for session in sessions:
        session.close()
    await asyncio.gather(*(c.close() for c in connections))

    window = last["t"] - first["t"]
    latencies.sort()
    cpu = {k: (last["cpu"][k] - first["cpu"][k]) / window for k in last["cpu"]}
    ours = sum(cpu.values())
    machine = (last["busy"] - first["busy"]) / window

    def delta(name: str) -> float:
        return m1.get(name, 0.0) - m0.get(name, 0.0)

    return {
        "n": n, "window_s": window, "register_s": register_s,
        "rate": counts["accepted"] / window, "calls_per_s": counts["calls"] / window,
        "p50_ms": percentile(latencies, 0.50) * 1e3, "p99_ms": percentile(latencies, 0.99) * 1e3,
        "max_ms": (latencies[-1] * 1e3) if latencies else float("nan"),
        "counts": counts, "errors": errors,
        "reply_bytes": statistics.mean(sizes) if sizes else 0,
        "cpu": cpu, "other_cpu": max(0.0, machine - ours),
        "steal": (last["steal"] - first["steal"]) / window,
        "etcd_txns": delta("paddlecloud_master_etcd_request_transactions_count"),
        "etcd_writes": delta("paddlecloud_master_etcd_request_transactions_sum"),
        "finishes": delta("paddlecloud_master_finishes_total"),
        "refreshes": delta("paddlecloud_master_lease_refreshes_total"),
    }


# ---- the orchestrator ---------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="paddlecloud-bench-", dir=args.dir))
        self.etcd = None
        self.noop: subprocess.Popen | None = None
        self.noop_port = 0
        self.masters: list[subprocess.Popen] = []
        self.script = str(Path(__file__).resolve())

    # -- processes --

    def start_etcd(self) -> None:
        from paddlecloud.etcd_server import EtcdServer
        (self.work / "etcd").mkdir()
        self.etcd = EtcdServer(str(self.work / "etcd")).start()

    def start_noop(self, path: str) -> None:
        self.noop_port = free_port()
        config = {"port": self.noop_port, "path": path, "task_id": 12345, "attempt": 123456}
        self.noop = subprocess.Popen([sys.executable, self.script, "--role", "noop",
                                      "--config", json.dumps(config)],
                                     stdout=subprocess.PIPE, text=True)
        if self.noop.stdout.readline().strip() != "ready":
            raise RuntimeError("the no-op server did not start")

    def master_command(self, job: str, port: int, metrics_port: int, data: Path, epochs: int) -> list[str]:
        return [sys.executable, "-m", "paddlecloud", "master", "--job", job,
                "--etcd-endpoints", self.etcd.endpoint, "--port", str(port), "--host", "127.0.0.1",
                "--advertise", f"127.0.0.1:{port}", "--input", str(data), "--chunk-bytes", "1",
                "--epochs", str(epochs), "--metrics-port", str(metrics_port)]

    def start_master(self, job: str, data: Path, epochs: int, tree: Path = ROOT,
                     ) -> tuple[subprocess.Popen, str, str, float]:
        """Starts a master (from the source tree `tree`); returns (process, address, metrics
        url, seconds from spawn to health SERVING)."""
        port, metrics_port = free_ports(2)
        log = open(self.work / f"{job}.log", "ab")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if tree != ROOT:  # `python -m` puts the cwd first on sys.path, PYTHONPATH next
            env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        started = time.perf_counter()
        process = subprocess.Popen(self.master_command(job, port, metrics_port, data, epochs),
                                   stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(tree))
        log.close()
        self.masters.append(process)
        address = f"127.0.0.1:{port}"
        self.wait_serving(address, process, job)
        return process, address, f"http://127.0.0.1:{metrics_port}/metrics", time.perf_counter() - started

    def wait_serving(self, address: str, process: subprocess.Popen, job: str, timeout: float = 120) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        deadline = time.perf_counter() + timeout
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.perf_counter() < deadline:
                if process.poll() is not None:
                    raise RuntimeError(f"master {job} exited with {process.returncode}; "
                                       f"see {self.work / (job + '.log')}")
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.02)
        raise RuntimeError(f"master {job} not SERVING after {timeout}s")

    def stop_master(self, process: subprocess.Popen) -> None:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=20)
        self.masters.remove(process)

    def client(self, *, target: str, n: int, prefix: str, pids: dict[str, int],
               metrics: str | None = None, profile: tuple[int, Path] | None = None) -> dict:
        config = {"target": target, "n": n, "prefix": prefix, "pids": pids, "metrics": metrics,
                  "warmup": self.args.warmup, "duration": self.args.duration}
        spy = None
        if profile is not None:
            spy = self.start_profile(*profile)
        out = subprocess.run([sys.executable, self.script, "--role", "client",
                              "--config", json.dumps(config)],
                             capture_output=True, text=True, timeout=600)
        if spy is not None:
            spy.wait(timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"client failed ({out.returncode}):\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    def start_profile(self, pid: int, path: Path) -> subprocess.Popen | None:
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not os.path.exists(spy):
            print("  (py-spy not found: pip install py-spy; not profiling)", file=sys.stderr)
            return None
        # The window starts after registration; record warm-up + window + registration slack.
        seconds = int(self.args.warmup + self.args.duration + 3)
        return subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(seconds),
                                 "--rate", "200", "--nonblocking", "--format", "raw",
                                 "-o", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def close(self) -> None:
        for process in list(self.masters):
            with contextlib.suppress(Exception):
                self.stop_master(process)
        if self.noop is not None and self.noop.poll() is None:
            self.noop.terminate()
            with contextlib.suppress(Exception):
                self.noop.wait(timeout=10)
        if self.etcd is not None:
            self.etcd.stop()
        if not self.args.keep:
            shutil.rmtree(self.work, ignore_errors=True)


def header(args: argparse.Namespace, bench: Bench) -> list[str]:
    import grpc
    from google.protobuf import __version__ as protobuf_version

    from paddlecloud.etcd_server import find_etcd_binary

    etcd_bin = find_etcd_binary()
    data_dir = str(bench.work / "etcd")
    fs = filesystem_of(data_dir)
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = os.getloadavg()
    return [
        "paddlecloud dispatch benchmark" + ("  (--quick: reduced, not for figures)" if args.quick else ""),
        f"machine: {os.cpu_count()} cores ({cpu_model()}), {mem_gib:.0f} GiB, {platform.system()} "
        f"{platform.release()}; load average before the run {load[0]:.2f}",
        f"software: Python {platform.python_version()}, grpcio {grpc.__version__}, protobuf {protobuf_version}",
        f"etcd: {etcd_version(etcd_bin)} ({etcd_bin}), data dir {data_dir} on {fs} "
        f"(4 KiB write+fdatasync median {fdatasync_ms(data_dir):.2f} ms); flags: paddlecloud's "
        "EtcdServer defaults (--auto-compaction-mode revision --auto-compaction-retention 100000), "
        "fsync on",
        "master: `paddlecloud master` default flags + --input <sparse file> --chunk-bytes 1 "
        "--epochs E --metrics-port P (one chunk = one task; max 2 tasks per trainer; logs at INFO)",
        f"client: 1 process, N asyncio trainers, one gRPC channel each; warm-up {args.warmup:g} s, "
        f"window {args.duration:g} s; the same client loop against the no-op server"
        + (f"; each row the median of {args.repeat} interleaved runs" if args.repeat > 1 else ""),
    ]


def fmt_int(x: float) -> str:
    return f"{x:,.0f}"


def median_run(runs: list[dict]) -> dict:
    """Of repeated runs, the one with the median rate (its other figures stay consistent)."""
    ordered = sorted(runs, key=lambda r: r["rate"] or r["calls_per_s"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["all_rates"] = [r["rate"] or r["calls_per_s"] for r in runs]
    return chosen


def per_task_us(result: dict, who: str = "master") -> float:
    """CPU microseconds `who` spent per finished task (per call for the no-op server)."""
    done = result["rate"] or result["calls_per_s"]
    return result["cpu"].get(who, 0.0) / done * 1e6 if done else float("nan")


def table(rows: list[dict]) -> list[str]:
    cols = ["N", "tasks/s", "p50 ms", "p99 ms", "txn/task", "writes/txn", "no-op calls/s",
            "no-op p99", "master/no-op", "errors", "CPU us/task master+etcd", "no-op us/call"]
    if any("base" in r for r in rows):
        cols += ["baseline tasks/s", "baseline us/task", "new/baseline"]
    body = []
    for r in rows:
        m, z = r["master"], r["noop"]
        txn = m["etcd_txns"] / m["finishes"] if m["finishes"] else float("nan")
        wpt = m["etcd_writes"] / m["etcd_txns"] if m["etcd_txns"] else float("nan")
        errors = sum(m["errors"].values()) + sum(z["errors"].values())
        line = [str(m["n"]), fmt_int(m["rate"]), f"{m['p50_ms']:.1f}", f"{m['p99_ms']:.1f}",
                f"{txn:.3f}", f"{wpt:.1f}", fmt_int(z["calls_per_s"]), f"{z['p99_ms']:.1f}",
                f"{m['rate'] / z['calls_per_s']:.0%}" if z["calls_per_s"] else "-",
                str(errors), f"{per_task_us(m):.0f}+{per_task_us(m, 'etcd'):.0f}",
                f"{per_task_us(z):.0f}"]
        if "base" in r:
            b = r["base"]
            line += [fmt_int(b["rate"]), f"{per_task_us(b):.0f}",
                     f"{m['rate'] / b['rate']:.2f}x" if b["rate"] else "-"]
        body.append(line)
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    for b in body:
        lines.append("  ".join(c.rjust(w) for c, w in zip(b, widths, strict=True)))
    return lines


def run(args: argparse.Namespace) -> int:
    bench = Bench(args)
    out: list[str] = []

    def say(line: str = "") -> None:
        out.append(line)
        print(line, flush=True)

    results: dict = {"args": vars(args)}
    try:
        fs = filesystem_of(str(bench.work))
        if fs in ("tmpfs", "ramfs") and not args.allow_tmpfs:
            raise SystemExit(f"{bench.work} is on {fs}: durable means fsynced to a disk; "
                             "give --dir on a real disk")
        bench.start_etcd()
        for line in header(args, bench):
            say(line)
        main_data = sparse_file(bench.work / "main.dat", args.chunks)
        bench.start_noop(str(main_data))
        pids_base = {"etcd": bench.etcd.process.pid}
        say()
        say(f"Dispatch: {fmt_int(args.chunks)}-chunk dataset, {args.epochs} epochs; "
            f"each row: a fresh master and job, then the no-op server, same N")
        rows = []
        for n in args.ns:
            runs: dict[str, list[dict]] = {"master": [], "noop": [], "base": []}
            for rep in range(args.repeat):
                job = f"bench-{os.getpid()}-n{n}-{rep}"
                master, address, metrics, _ = bench.start_master(job, main_data, args.epochs)
                profile = None
                if args.profile and rep == 0 and n == min(args.ns, key=lambda x: abs(x - 64)):
                    Path(args.profile).mkdir(parents=True, exist_ok=True)
                    profile = (master.pid, Path(args.profile) / f"master-n{n}.txt")
                runs["master"].append(bench.client(target=address, n=n, prefix=f"t{n}-", metrics=metrics,
                                                   pids={**pids_base, "master": master.pid},
                                                   profile=profile))
                bench.stop_master(master)
                runs["noop"].append(bench.client(target=f"127.0.0.1:{bench.noop_port}", n=n,
                                                 prefix="noop-", pids={"master": bench.noop.pid}))
                if args.baseline:
                    master, address, metrics, _ = bench.start_master(
                        f"{job}-base", main_data, args.epochs, tree=Path(args.baseline).resolve())
                    runs["base"].append(bench.client(target=address, n=n, prefix=f"b{n}-",
                                                     metrics=metrics,
                                                     pids={**pids_base, "master": master.pid}))
                    bench.stop_master(master)
            row = {k: median_run(v) for k, v in runs.items() if v}
            rows.append(row)
            spread = {k: "/".join(fmt_int(x["rate"] or x["calls_per_s"]) for x in v)
                      for k, v in runs.items() if v}
            print(f"  N={n}: tasks/s {spread['master']}; no-op calls/s {spread['noop']}"
                  + (f"; baseline tasks/s {spread['base']}" if "base" in spread else ""),
                  file=sys.stderr, flush=True)
        results["rows"] = rows
        say()
        for line in table(rows):
            say(line)
        say("  tasks/s: finishes the master answered ACCEPTED per second (one GetTask per task);")
        say("  txn/task: etcd Txn requests (group-commit batches) per finished task, from the master's")
        say("  metrics; writes/txn: RPC transactions per batch; CPU us/task: CPU time the master and")
        say("  etcd used per finished task in the window (per call for the no-op server).")
        if args.baseline:
            say(f"  baseline: the master of the source tree {args.baseline}, same etcd, same client,")
            say("  run right after the no-op server in each row.")
        say(f"  reply bytes: master {rows[-1]['master']['reply_bytes']:.0f}, "
            f"no-op {rows[-1]['noop']['reply_bytes']:.0f}; other load on the machine during the "
            f"last row: {rows[-1]['master']['other_cpu']:.0%} of a core, steal "
            f"{rows[-1]['master']['steal']:.0%}")
        for r in rows:
            if r["master"]["errors"] or r["noop"]["errors"]:
                say(f"  errors at N={r['master']['n']}: master {r['master']['errors']} "
                    f"no-op {r['noop']['errors']}")

        if args.no_large:
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))
            return 0
        # -- the large dataset --
        say()
        big_n = args.big_trainers
        say(f"Large dataset: {fmt_int(args.big_chunks)} chunks (one sparse file, --chunk-bytes 1) vs "
            f"{fmt_int(args.small_chunks)} chunks, {big_n} trainers")
        small_data = sparse_file(bench.work / "small.dat", args.small_chunks)
        big_data = sparse_file(bench.work / "big.dat", args.big_chunks)
        job = f"bench-{os.getpid()}-small"
        master, address, metrics, _ = bench.start_master(job, small_data, 100000)
        small = bench.client(target=address, n=big_n, prefix="s-", metrics=metrics,
                             pids={**pids_base, "master": master.pid})
        bench.stop_master(master)
        job = f"bench-{os.getpid()}-big"
        master, address, metrics, start_s = bench.start_master(job, big_data, 2)
        rss_start = rss_mb(master.pid)
        big = bench.client(target=address, n=big_n, prefix="b-", metrics=metrics,
                           pids={**pids_base, "master": master.pid})
        rss_after = rss_mb(master.pid)
        bench.stop_master(master)
        # A restart on the same etcd: the frozen list is read back, the done marks too.
        master, address, metrics, restart_s = bench.start_master(job, big_data, 2)
        rss_restart = rss_mb(master.pid)
        bench.stop_master(master)
        done_marks = int(big["counts"]["accepted"])  # at least this many were in etcd
        ratio = big["rate"] / small["rate"] if small["rate"] else float("nan")
        steady = next((r["master"] for r in rows if r["master"]["n"] == big_n), None)
        say(f"  start-up to health SERVING (fresh job: list, freeze, shuffle): {start_s:.2f} s")
        say(f"  master RSS: {rss_start:.0f} MB after start-up, {rss_after:.0f} MB after dispatching")
        say(f"  restart of that job (read back from etcd, >= {fmt_int(done_marks)} done marks): "
            f"{restart_s:.2f} s to SERVING, RSS {rss_restart:.0f} MB")
        say(f"  {big_n} trainers: {fmt_int(args.small_chunks)} chunks {fmt_int(small['rate'])} tasks/s "
            f"(p99 {small['p99_ms']:.1f} ms, {small['counts']['epoch_done']} EPOCH_DONE, "
            f"{small['counts']['wait']} WAIT: an epoch ends every {fmt_int(args.small_chunks)} tasks); "
            f"{fmt_int(args.big_chunks)} chunks {fmt_int(big['rate'])} tasks/s "
            f"(p99 {big['p99_ms']:.1f} ms); ratio {ratio:.2f}")
        if steady is not None and steady["rate"]:
            say(f"  {fmt_int(args.big_chunks)} chunks vs the {fmt_int(args.chunks)}-chunk row above (no epoch "
                f"end in its window), same N: ratio {big['rate'] / steady['rate']:.2f}")
        results["large"] = {"small": small, "big": big, "start_s": start_s, "restart_s": restart_s,
                            "rss_start_mb": rss_start, "rss_after_mb": rss_after,
                            "rss_restart_mb": rss_restart}

        # -- targets --
        say()
        say("Targets (2-core box)" + ("  [--quick: sizes reduced, not a verdict]" if args.quick else ""))
        at = {r["master"]["n"]: r for r in rows}
        ref_n = 64 if 64 in at else max(at)

        def verdict(ok: bool) -> str:
            return "met" if ok else "MISSED"

        r = at[ref_n]
        share = r["master"]["rate"] / r["noop"]["calls_per_s"] if r["noop"]["calls_per_s"] else 0
        say(f"  >= {fmt_int(TARGETS['rate_64'])} finished tasks/s at {ref_n} trainers: "
            f"{fmt_int(r['master']['rate'])}  {verdict(r['master']['rate'] >= TARGETS['rate_64'])}")
        say(f"  >= {TARGETS['ceiling_share']:.0%} of the no-op ceiling at {ref_n} trainers: {share:.0%}  "
            f"{verdict(share >= TARGETS['ceiling_share'])}")
        worst = max(rows, key=lambda x: x["master"]["p99_ms"])["master"]
        say(f"  p99 GetTask <= {TARGETS['p99_ms']:g} ms: {r['master']['p99_ms']:.1f} ms at {ref_n} trainers "
            f"(worst {worst['p99_ms']:.1f} ms at {worst['n']})  "
            f"{verdict(r['master']['p99_ms'] <= TARGETS['p99_ms'])}")
        top = at[max(at)]
        errors = sum(top["master"]["errors"].values())
        say(f"  {max(at)} trainers served without error: {errors} errors  {verdict(errors == 0)}")
        say(f"  {fmt_int(args.big_chunks)}-chunk start <= {TARGETS['start_s']:g} s: {start_s:.2f} s  "
            f"{verdict(start_s <= TARGETS['start_s'])}")
        peak = max(rss_start, rss_after, rss_restart)
        say(f"  RSS <= {TARGETS['rss_mb']:g} MB: {peak:.0f} MB  {verdict(peak <= TARGETS['rss_mb'])}")
        say(f"  dispatch at {fmt_int(args.big_chunks)} chunks within 20% of {fmt_int(args.small_chunks)}: "
            f"ratio {ratio:.2f}  {verdict(ratio >= TARGETS['big_vs_small'])}")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        return 0
    finally:
        bench.close()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/dispatch.py",
        description="Dispatch benchmark of the paddlecloud master against a real fsynced etcd, "
                    "side by side with a no-op gRPC server (the machine's ceiling).")
    parser.add_argument("--quick", action="store_true",
                        help="reduced run for a smoke test (< 60 s): short windows, smaller datasets")
    parser.add_argument("--ns", type=lambda s: [int(x) for x in s.split(",") if x],
                        help="comma-separated trainer counts [default 1,16,64,256; --quick 1,16]")
    parser.add_argument("--warmup", type=float, help="seconds before the window [1; --quick 0.3]")
    parser.add_argument("--duration", type=float, help="seconds measured per run [5; --quick 1.5]")
    parser.add_argument("--chunks", type=int, help="chunks (= tasks) of the main dataset [100000; --quick 20000]")
    parser.add_argument("--epochs", type=int, default=100, help="epochs of the main dataset [100]")
    parser.add_argument("--big-chunks", type=int, help="the large dataset [1000000; --quick 100000]")
    parser.add_argument("--small-chunks", type=int, default=1000, help="the small dataset [1000]")
    parser.add_argument("--big-trainers", type=int, help="trainers for the large/small comparison [64; --quick 8]")
    parser.add_argument("--no-large", action="store_true",
                        help="skip the large-dataset part (start-up, RSS, 1M vs 1,000 chunks)")
    parser.add_argument("--dir", default="/var/tmp",
                        help="where the etcd data dir and datasets go: a real disk [/var/tmp]")
    parser.add_argument("--allow-tmpfs", action="store_true",
                        help="run even if --dir is on tmpfs (smoke tests only: figures not durable)")
    parser.add_argument("--profile", metavar="DIR",
                        help="py-spy the master during the run nearest 64 trainers (collapsed stacks)")
    parser.add_argument("--baseline", metavar="TREE",
                        help="also run, in each row, the master of another source tree (a copy "
                             "of paddlecloud before a change): before/after in one run")
    parser.add_argument("--repeat", type=int,
                        help="run each row K times (master, no-op, baseline interleaved) and show "
                             "the median run: this box is shared and noisy [3; --quick 1]")
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, etcd data)")
    parser.add_argument("--role", choices=["noop", "client"], help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick = args.quick
    args.ns = args.ns or ([1, 16] if quick else [1, 16, 64, 256])
    args.warmup = args.warmup if args.warmup is not None else (0.3 if quick else 1.0)
    args.duration = args.duration if args.duration is not None else (1.5 if quick else 5.0)
    args.chunks = args.chunks or (20_000 if quick else 100_000)
    args.big_chunks = args.big_chunks or (100_000 if quick else 1_000_000)
    args.big_trainers = args.big_trainers or (8 if quick else 64)
    args.repeat = args.repeat or (1 if quick else 3)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.role == "noop":
        run_noop(json.loads(args.config))
        return 0
    if args.role == "client":
        run_client(json.loads(args.config))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
