"""Scale benchmark of one master: N trainers (up to 10,000) in K client processes, the no-op
ceiling and a baseline tree side by side in one run, then the failover, expiry and
big-dataset scenarios, audited from etcd's history.

    python bench/scale.py --quick                       # < 1 minute on 2 cores: a smoke test
    python bench/scale.py --clients 12 --baseline TREE  # the table of issue 17 (16 cores)

What runs, each in its own process:
  * etcd (`paddlecloud.etcd_server.EtcdServer`, fsync on, data dir on a real disk);
  * `paddlecloud master`, default flags plus the dataset (`--chunk-bytes 1`: one byte of a
    sparse file is one task) and `--metrics-port`;
  * the no-op gRPC server of bench/dispatch.py (`--role noop`): the ceiling of the machine
    for the same client, over the same transport as the master's trainers (a stream, or
    unary with `--unary`);
  * optionally the master of another source tree (`--baseline TREE`, e.g. a `git worktree`
    of the commit before a change), same etcd, same client;
  * K client processes (`--role client`), each with its share of the N trainers, one gRPC
    channel (TCP connection) per trainer. Each trainer is the client users run, not a copy
    of it: a `paddlecloud.master_client` connection and session (what trainer_agent's
    TaskClient runs on its event-loop thread), so its retries, backoff, leader following,
    keep-alives and task stream are trainer_agent's. A trainer registers, then loops GetTask
    with the previous task's ack piggybacked; on WAIT it sleeps retry_after x U(0.5, 1.5).
    With two masters (failover) the trainers find the leader through etcd, as trainer_agent
    does there. `--unary`: the masters (`--no-task-streams`) and the no-op server refuse
    GetTaskStream, so the trainers call GetTask unary, as trainer_agent does there.

Rows (the steady state, N = --ns): finished tasks/s (ACCEPTED acks in the window), latency
of a GetTask that got a task (from its first attempt, retries included), calls shed,
other transient codes, errors a trainer could not retry, re-registrations; per trainer per
second: master RPCs, KeepAlives, etcd requests (etcd's own gRPC message counter: the
master's Txns, Ranges and lease keep-alive messages); fairness (tasks per trainer in the
window: the least served trainer and how many got none); master and etcd CPU.

Scenarios: failover (SIGKILL of the leader at 25% of a job, default flags: time to the
standby serving, to every trainer served again, re-registrations, lost/double-counted
from etcd's history); expiry (a client process holding V sessions SIGKILLed: the
survivors' throughput while the leases lapse, and when their tasks are back); big datasets
(a fresh 10M-task job: start-up and RSS; the epoch turnover over gRPC; a master
rebuilding a 1M-task epoch with 900k done marks).

Speed goals live here, never in tests. Figures on a shared machine move +-25% between runs:
compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/scale.py` from a checkout
    sys.path.insert(0, str(ROOT))

from common import (  # noqa: E402  (after the sys.path line above)
    Master,
    cpu_seconds,
    free_port,
    machine_lines,
    percentile,
    refuse_tmpfs,
    register_all,
    rss_mb,
    scrape,
    sparse_file,
    start_etcd,
    table,
)

DISPATCH = Path(__file__).resolve().parent / "dispatch.py"
PRIME_CAP = 120.0  # seconds after the start a steady row's window opens even if some trainer was never served
TRAINER_DEADLINE = 300.0  # seconds a trainer's call retries (trainer_agent's PADDLECLOUD_MASTER_DEADLINE default)
GOALS = {"ratio_64": 2.0, "ceiling_share": 0.6, "expiry_cost": 0.20, "failover_over_ttl_s": 2.0,
         "start_s": 5.0, "rss_mb": 500.0, "turnover_s": 1.0}


# ---- the client: its share of the trainers (its own process) -----------------------------


def run_client(config: dict) -> None:
    print(json.dumps(asyncio.run(_client(config))), flush=True)


async def _client(config: dict) -> dict:  # noqa: C901  (one loop, kept in one place to read)
    """The client process's trainers: each a real `paddlecloud.master_client` connection and
    session (the code trainer_agent runs), on one event loop; figures of the window."""
    import grpc

    from paddlecloud.api import pb
    from paddlecloud.auth import ClientCredentials
    from paddlecloud.master_client import (
        MasterConnection,
        MasterLocator,
        Session,
    )
    from paddlecloud.wire import CLIENT_KEEPALIVE, seconds

    n, first = config["n"], config["first"]
    options = [("grpc.use_local_subchannel_pool", 1), *CLIENT_KEEPALIVE]  # one TCP connection per trainer
    # Two masters: found as trainer_agent finds them through etcd (the leader key, a standby's
    # NOT_LEADER hint); one: at its address, as through a Service.
    locator = (MasterLocator(etcd_endpoints=config["etcd"], job=config["job"]) if config.get("job")
               else MasterLocator(master_endpoint=config["targets"][0]))
    transient: Counter = Counter()
    errors: Counter = Counter()
    counts: Counter = Counter()
    latencies: list[float] = []
    per_trainer = [0] * n
    buckets: Counter = Counter()          # whole wall-clock second -> ACCEPTED acks
    epochs = [0] * n
    resumed: dict[int, float] = {}        # trainer -> first answer after the mark
    mark: list[float] = []
    keepalives: dict[str, int] = {}       # the sessions' KeepAlives when the window opened ("w0"), closed
    loop = asyncio.get_running_loop()
    window = {"w0": math.inf, "w1": math.inf, "stop": math.inf}

    def in_window(when: float) -> bool:
        return window["w0"] <= when <= window["w1"]

    def observe(error: BaseException) -> None:
        """Every failed attempt a connection retries (its code), in the window or after a kill."""
        if in_window(time.time()) or mark:
            transient[error.code().name if isinstance(error, grpc.RpcError) else type(error).__name__] += 1

    def registered(i: int, reply: pb.RegisterTrainerResponse) -> None:
        epochs[i] = reply.current_epoch

    connections = [MasterConnection(locator, deadline=TRAINER_DEADLINE, credentials=ClientCredentials(),
                                    open_channel=lambda address: grpc.aio.insecure_channel(address, options=options),
                                    observe=observe) for _ in range(n)]
    sessions = [Session(connections[i], trainer_id=f"{config['prefix']}{first + i}",
                        on_register=lambda reply, i=i: registered(i, reply)) for i in range(n)]

    register_s = await register_all(sessions, at_once=64)
    # Sessions are kept (the sessions' keep-alive tasks) while the trainers wait for the others.
    print(json.dumps({"registered": n, "register_s": register_s}), flush=True)
    go = json.loads(await loop.run_in_executor(None, sys.stdin.readline))
    # The window; with `prime`, it is not known yet: it starts once every trainer of every client
    # had a task accepted (the orchestrator sends it), since with N trainers queued one round of
    # GetTask takes N / throughput seconds and a fixed warm-up can end before the first acks.
    if not config.get("prime"):
        window.update(w0=go["t0"] + config["warmup"], w1=go["t0"] + config["warmup"] + config["duration"])
        window["stop"] = go.get("stop", window["w1"])
    primed: set[int] = set()
    said_primed = False

    def say_primed(when: float) -> None:  # once; `partial`: not every trainer by PRIME_CAP
        nonlocal said_primed
        if not said_primed:
            said_primed = True
            print(json.dumps({"primed": when, "partial": n - len(primed)}), flush=True)

    async def prime_cap() -> None:
        await asyncio.sleep(max(0.0, go["t0"] + PRIME_CAP - time.time()))
        say_primed(time.time())

    async def listen() -> None:  # later lines: {"mark": wall time} (a kill happened), {"window": [w0, w1]}
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            message = json.loads(line)
            if "window" in message:
                window["w0"], window["w1"] = message["window"]
                window["stop"] = window["w1"]
            else:
                mark.append(message["mark"])

    def took(i: int, reply: pb.GetTaskResponse, asked: float) -> list:
        """Counts an answered GetTask; the acks the next one carries."""
        now = time.time()
        for edge in ("w0", "w1"):
            if edge not in keepalives and now >= window[edge]:
                keepalives[edge] = sum(s.keepalives for s in sessions)
        if mark and i not in resumed and now > mark[-1]:
            resumed[i] = now
        measured = in_window(now)
        for result in reply.finished_results:
            accepted = result == pb.ACCEPTED
            if accepted:
                buckets[int(now)] += 1
                if config.get("prime") and i not in primed:
                    primed.add(i)
                    if len(primed) == n:
                        say_primed(now)
            if measured:
                counts["accepted" if accepted else "stale"] += 1
                per_trainer[i] += accepted
        counts["calls"] += measured
        if reply.outcome == pb.TASK:
            acks = [pb.TaskRef(task_id=t.id, epoch=t.epoch, attempt=t.attempt)
                    for t in (reply.task, *reply.more_tasks)]
            if measured:
                counts["task"] += len(acks)
                latencies.append(now - asked)  # from the first attempt, retries included
            return acks
        counts["wait"] += measured and reply.outcome == pb.WAIT
        if reply.outcome == pb.EPOCH_DONE:
            epochs[i] = reply.current_epoch
        return []

    async def trainer(i: int) -> None:
        """trainer_agent's loop: GetTask with the previous task's acks; on WAIT, sleep
        retry_after x U(0.5, 1.5); the session's own retries and registrations."""
        session, connection, previous = sessions[i], connections[i], []
        while time.time() < window["stop"]:
            asked = time.time()
            try:
                reply = await session.run(lambda s, acks=previous: connection.get_task(
                    s, epoch=epochs[i], finished=acks, max_tasks=config["max_tasks"]))
            except grpc.RpcError as error:  # (MasterUnavailable too) a trainer would stop here
                errors[error.code().name] += 1
                return
            previous = took(i, reply, asked)
            if reply.outcome == pb.JOB_DONE:
                counts["job_done"] += 1
                return
            if reply.outcome == pb.WAIT:
                await asyncio.sleep(seconds(reply.retry_after) * random.uniform(0.5, 1.5))

    helpers = [loop.create_task(listen())]
    if config.get("prime"):
        helpers.append(loop.create_task(prime_cap()))
    workers = [loop.create_task(trainer(i)) for i in range(n)]
    await asyncio.wait(workers)
    for task in helpers:
        task.cancel()
    for task in workers:
        if task.exception() is not None:
            errors[f"trainer:{type(task.exception()).__name__}"] += 1
    for session in sessions:
        session.close()
    await asyncio.gather(*(c.close() for c in connections))
    return {"n": n, "counts": dict(counts), "transient": dict(transient), "errors": dict(errors),
            "reregistered": sum(s.reregistrations for s in sessions), "latencies": latencies,
            "per_trainer": per_trainer,
            "keepalives": keepalives.get("w1", sum(s.keepalives for s in sessions)) - keepalives.get("w0", 0),
            "buckets": {str(k): v for k, v in buckets.items()}, "resumed": list(resumed.values()),
            "register_s": register_s}


# ---- the orchestrator --------------------------------------------------------------------


class Clients:
    """K client processes sharing N trainers; started, registered, then released together."""

    def __init__(self, *, targets: list[str], n: int, k: int, prefix: str,
                 warmup: float, duration: float, stop: float | None = None, max_tasks: int = 1,
                 prime: bool = False, etcd: str = "", job: str = "") -> None:
        k = max(1, min(k, n))
        shares = [n // k + (1 if i < n % k else 0) for i in range(k)]
        self.processes: list[subprocess.Popen] = []
        first = 0
        for share in shares:
            config = {"targets": targets, "n": share, "first": first, "prefix": prefix,
                      "etcd": etcd, "job": job, "warmup": warmup,
                      "duration": duration, "max_tasks": max_tasks, "prime": prime}
            first += share
            self.processes.append(subprocess.Popen(
                [sys.executable, __file__, "--role", "client", "--config", json.dumps(config)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        self.stop = stop
        self.register_s = 0.0

    def go(self, timeout: float = 600) -> float:
        """Waits until every trainer registered; starts them all; returns the wall start time."""
        deadline = time.time() + timeout
        for p in self.processes:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"a client process exited with {p.wait()} before registering")
            self.register_s = max(self.register_s, json.loads(line)["register_s"])
            if time.time() > deadline:
                raise RuntimeError("registration took too long")
        t0 = time.time() + 0.2
        message = {"t0": t0, **({"stop": t0 + self.stop} if self.stop is not None else {})}
        for p in self.processes:
            p.stdin.write(json.dumps(message) + "\n")
            p.stdin.flush()
        return t0

    def window(self, *, earliest: float, duration: float) -> tuple[float, float, int]:
        """Waits until every client said its trainers all had a task accepted (or PRIME_CAP
        passed); sends each the window that starts then. (w0, w1, trainers never served)."""
        partial = 0
        for p in self.processes:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"a client process exited with {p.wait()} before its window")
            partial += json.loads(line)["partial"]
        w0 = max(time.time() + 0.2, earliest)
        for p in self.processes:
            p.stdin.write(json.dumps({"window": [w0, w0 + duration]}) + "\n")
            p.stdin.flush()
        return w0, w0 + duration, partial

    def mark(self, when: float) -> None:
        for p in self.processes:
            with contextlib.suppress(OSError, ValueError):
                p.stdin.write(json.dumps({"mark": when}) + "\n")
                p.stdin.flush()

    def results(self, timeout: float = 900) -> list[dict]:
        found = []
        for p in self.processes:
            out, _ = p.communicate(timeout=timeout)
            lines = [x for x in out.strip().splitlines() if x.startswith("{")]
            if p.returncode != 0 or not lines:
                raise RuntimeError(f"a client process failed ({p.returncode})")
            found.append(json.loads(lines[-1]))
        return found

    def kill(self) -> None:
        for p in self.processes:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)


def merge(parts: list[dict]) -> dict:
    merged: dict = {"n": 0, "counts": Counter(), "transient": Counter(), "errors": Counter(),
                    "reregistered": 0, "latencies": [], "per_trainer": [], "keepalives": 0,
                    "buckets": Counter(), "resumed": []}
    for p in parts:
        merged["n"] += p["n"]
        for key in ("counts", "transient", "errors", "buckets"):
            merged[key].update(p[key])
        for key in ("reregistered", "keepalives"):
            merged[key] += p[key]
        for key in ("latencies", "per_trainer", "resumed"):
            merged[key].extend(p[key])
    merged["latencies"].sort()
    return merged


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="paddlecloud-scale-", dir=args.dir))
        self.etcd = None
        self.noop: subprocess.Popen | None = None
        self.noop_address = ""
        self.masters: list[Master] = []
        self.tag = f"{os.getpid()}"

    def start(self) -> None:
        refuse_tmpfs(str(self.work), self.args.allow_tmpfs)
        self.etcd = start_etcd(self.work / "etcd")

    def start_noop(self, path: str) -> None:
        port = free_port()
        config = {"port": port, "path": path, "task_id": 12345, "attempt": 123456,
                  "streams": not self.args.unary}
        self.noop = subprocess.Popen([sys.executable, str(DISPATCH), "--role", "noop", "--config",
                                      json.dumps(config)], stdout=subprocess.PIPE, text=True)
        if self.noop.stdout.readline().strip() != "ready":
            raise RuntimeError("the no-op server did not start")
        self.noop_address = f"127.0.0.1:{port}"

    def master(self, job: str, data: Path, epochs: int, *flags: str, name: str = "m",
               tree: Path = ROOT) -> tuple[Master, str]:
        metrics_port = free_port()
        m = Master(job=job, etcd=self.etcd.endpoint, log_dir=self.work, name=name, tree=tree,
                   args=["--input", str(data), "--chunk-bytes", "1", "--epochs", str(epochs),
                         "--metrics-port", str(metrics_port),
                         *(["--no-task-streams"] if self.args.unary else []), *flags]).start()
        self.masters.append(m)
        return m, f"http://127.0.0.1:{metrics_port}/metrics"

    def close(self) -> None:
        for m in self.masters:
            with contextlib.suppress(Exception):
                m.stop()
        if self.noop is not None and self.noop.poll() is None:
            self.noop.terminate()
            with contextlib.suppress(Exception):
                self.noop.wait(timeout=10)
        if self.etcd is not None:
            self.etcd.stop()
        if not self.args.keep:
            shutil.rmtree(self.work, ignore_errors=True)


def etcd_requests(bench: Bench) -> float:
    """Messages etcd's gRPC server received so far (every Txn, Range, lease keep-alive...)."""
    found = scrape(f"{bench.etcd.endpoint}/metrics")
    return sum(v for k, v in found.items() if k.startswith("grpc_server_msg_received_total"))


class NewCalls:
    """A new GetStatus call every PERIOD seconds from `start` to `end`, over one channel of its
    own, timed: how long a call the master has not taken up yet waits behind its trainers'
    (an operator's look, a new trainer's first call). GetStatus is never shed."""

    PERIOD = 0.5

    def __init__(self, address: str, start: float, end: float) -> None:
        self.latencies: list[float] = []
        self.errors: Counter[str] = Counter()
        self._thread = threading.Thread(target=self._run, args=(address, start, end), daemon=True)
        self._thread.start()

    def _run(self, address: str, start: float, end: float) -> None:
        import grpc

        from paddlecloud.api import pb, pb_grpc
        with grpc.insecure_channel(address) as channel:
            master = pb_grpc.MasterStub(channel)
            at = start
            while at < end:
                time.sleep(max(0.0, at - time.time()))
                began = time.perf_counter()
                try:
                    master.GetStatus(pb.GetStatusRequest(), timeout=120)
                    self.latencies.append(time.perf_counter() - began)
                except grpc.RpcError as error:
                    self.errors[error.code().name] += 1
                at = max(at + self.PERIOD, time.time())

    def result(self) -> dict:
        self._thread.join()
        ordered = sorted(self.latencies)
        return {"new_call_p50_ms": percentile(ordered, 0.50) * 1e3,
                "new_call_max_ms": ordered[-1] * 1e3 if ordered else float("nan"),
                "new_calls": len(ordered), "new_call_errors": dict(self.errors)}


def measure(bench: Bench, *, targets: list[str], n: int, prefix: str,
            pids: dict[str, int], metrics: str | None, max_tasks: int = 1) -> dict:
    """One steady-state run: K clients against `targets`, figures of the window. Against a
    master (`metrics`), the window opens once every trainer had a task accepted (see
    `Clients.window`), and not before the warm-up; against the no-op server, after the warm-up."""
    args = bench.args
    prime = metrics is not None
    clients = Clients(targets=targets, n=n, k=args.clients, prefix=prefix,
                      warmup=args.warmup, duration=args.duration, max_tasks=max_tasks, prime=prime)
    unserved, new_calls = 0, None
    try:
        t0 = clients.go()
        w0, w1 = t0 + args.warmup, t0 + args.warmup + args.duration
        if prime:
            w0, w1, unserved = clients.window(earliest=w0, duration=args.duration)
        new_calls = NewCalls(targets[0], w0, w1) if prime else None
        time.sleep(max(0.0, w0 - time.time()))

        def sample() -> dict:
            return {"t": time.time(), "cpu": {k: cpu_seconds(p) for k, p in pids.items()},
                    "m": scrape(metrics) if metrics else {}, "etcd": etcd_requests(bench)}
        first = sample()
        time.sleep(max(0.0, w1 - time.time()))
        last = sample()
        parts = clients.results()
    finally:
        clients.kill()
    r = merge(parts)
    window = last["t"] - first["t"]

    def delta(name: str) -> float:
        return last["m"].get(name, 0.0) - first["m"].get(name, 0.0)

    rpcs = sum(last["m"].get(k, 0.0) - first["m"].get(k, 0.0) for k in last["m"]
               if k.startswith("paddlecloud_master_rpc_duration_seconds_count"))
    shed = sum(last["m"].get(k, 0.0) - first["m"].get(k, 0.0) for k in last["m"]
               if k.startswith("paddlecloud_master_shed_calls_total"))
    served = sorted(r["per_trainer"])
    return {
        "n": n, "clients": len(parts), "window_s": window, "register_s": clients.register_s,
        "warmup_s": w0 - t0, "unserved_at_window": unserved,
        "rate": r["counts"]["accepted"] / window, "calls_per_s": r["counts"]["calls"] / window,
        "p50_ms": percentile(r["latencies"], 0.50) * 1e3, "p99_ms": percentile(r["latencies"], 0.99) * 1e3,
        "max_ms": r["latencies"][-1] * 1e3 if r["latencies"] else float("nan"),
        "counts": dict(r["counts"]), "transient": dict(r["transient"]), "errors": dict(r["errors"]),
        "reregistered": r["reregistered"], "keepalive_per_trainer_s": r["keepalives"] / window / n,
        "rpc_per_trainer_s": rpcs / window / n if metrics else float("nan"),
        "keepalive_rpc_per_trainer_s":
            delta('paddlecloud_master_rpc_duration_seconds_count{method="KeepAlive"}') / window / n,
        "etcd_per_trainer_s": (last["etcd"] - first["etcd"]) / window / n,
        "lease_refresh_per_trainer_s": delta("paddlecloud_master_lease_refreshes_total") / window / n,
        "shed_per_s": shed / window,
        "cpu": {k: (last["cpu"][k] - first["cpu"][k]) / window for k in pids},
        "served_min": served[0] if served else 0, "served_median": served[len(served) // 2] if served else 0,
        "starved": sum(1 for s in served if s == 0),
        **(new_calls.result() if new_calls is not None else {}),
    }


def new_call_cell(run: dict) -> str:
    cell = f"{run['new_call_p50_ms']:.0f}/{run['new_call_max_ms']:.0f}"
    return cell + (f" ({sum(run['new_call_errors'].values())} failed)" if run["new_call_errors"] else "")


def median_run(runs: list[dict]) -> dict:
    """Of repeated runs, the one with the median rate (its other figures stay consistent)."""
    ordered = sorted(runs, key=lambda r: r["rate"] or r["calls_per_s"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["all_rates"] = [r["rate"] or r["calls_per_s"] for r in runs]
    return chosen


def steady_rows(bench: Bench, data: Path, say) -> list[dict]:
    args = bench.args
    rows = []
    for n in args.ns:
        runs: dict[str, list[dict]] = {"master": [], "noop": [], "base": []}
        for rep in range(args.repeat):  # interleaved: a noisy neighbour hits all three alike
            job = f"scale-{bench.tag}-n{n}-{rep}"
            master, metrics = bench.master(job, data, args.epochs, *args.steady_flags.split())
            master.wait_serving()
            runs["master"].append(measure(
                bench, targets=[master.address], n=n, prefix=f"t{n}-",
                pids={"master": master.pid, "etcd": bench.etcd.process.pid}, metrics=metrics,
                max_tasks=args.max_tasks))
            master.stop()
            runs["noop"].append(measure(bench, targets=[bench.noop_address], n=n, prefix="noop-",
                                        pids={"master": bench.noop.pid}, metrics=None))
            if args.baseline:
                base, metrics = bench.master(f"{job}-base", data, args.epochs, *args.steady_flags.split(),
                                             tree=Path(args.baseline).resolve())
                base.wait_serving()
                runs["base"].append(measure(
                    bench, targets=[base.address], n=n, prefix=f"b{n}-",
                    pids={"master": base.pid, "etcd": bench.etcd.process.pid}, metrics=metrics))
                base.stop()
        row = {k: median_run(v) for k, v in runs.items() if v}
        rows.append(row)
        m = row["master"]
        print(f"  N={n}: {m['rate']:,.0f} tasks/s, p99 {m['p99_ms']:.0f} ms, no-op "
              f"{row['noop']['calls_per_s']:,.0f} calls/s"
              + (f", baseline {row['base']['rate']:,.0f} tasks/s" if "base" in row else ""),
              file=sys.stderr, flush=True)
    cols = ["N", "K", "tasks/s", "p50/p99 ms", "no-op calls/s", "master/no-op", "shed/s", "other transient",
            "errors", "re-reg", "RPC/tr/s", "KeepAlive/tr/s", "etcd req/tr/s", "least served", "starved",
            "CPU master+etcd", "register s", "warm-up s", "new call p50/max ms"]
    if args.baseline:
        cols += ["baseline tasks/s", "baseline p99", "baseline transient", "baseline KA/tr/s", "new/baseline",
                 "baseline register s", "baseline new call p50/max ms"]
    body = []
    for row in rows:
        m, z = row["master"], row["noop"]
        other = {k: v for k, v in m["transient"].items() if "RESOURCE_EXHAUSTED" not in k}
        line = [str(m["n"]), str(m["clients"]), f"{m['rate']:,.0f}", f"{m['p50_ms']:.0f}/{m['p99_ms']:.0f}",
                f"{z['calls_per_s']:,.0f}", f"{m['rate'] / z['calls_per_s']:.0%}" if z["calls_per_s"] else "-",
                f"{m['shed_per_s']:,.0f}", str(sum(other.values())), str(sum(m["errors"].values())),
                str(m["reregistered"]), f"{m['rpc_per_trainer_s']:.2f}",
                f"{m['keepalive_rpc_per_trainer_s']:.3f}", f"{m['etcd_per_trainer_s']:.2f}",
                str(m["served_min"]), str(m["starved"]),
                f"{m['cpu'].get('master', 0):.0%}+{m['cpu'].get('etcd', 0):.0%}", f"{m['register_s']:.2f}",
                f"{m['warmup_s']:.1f}" + (f" ({m['unserved_at_window']} unserved)" if m["unserved_at_window"] else ""),
                new_call_cell(m)]
        if "base" in row:
            b = row["base"]
            line += [f"{b['rate']:,.0f}", f"{b['p99_ms']:.0f}", str(sum(b["transient"].values())),
                     f"{b['keepalive_rpc_per_trainer_s']:.3f}", f"{m['rate'] / b['rate']:.2f}x" if b["rate"] else "-",
                     f"{b['register_s']:.2f}", new_call_cell(b)]
        body.append(line)
    for line in table(cols, body):
        say(line)
    say("  tasks/s: ACCEPTED acks per second; p50/p99: a GetTask that got a task, from its first attempt "
        "(retries after shedding included); shed/s: calls the master answered RESOURCE_EXHAUSTED; other "
        "transient: CANCELLED/UNAVAILABLE/DEADLINE_EXCEEDED the client retried; errors: codes no client "
        "retries; re-reg: sessions registered again; RPC/tr/s, KeepAlive/tr/s: the master's RPCs per "
        "trainer per second (its metrics); etcd req/tr/s: messages etcd's gRPC server received; least "
        "served: tasks of the least served trainer in the window; starved: trainers with none; register s: "
        "seconds until the last of the N trainers, all registering at once, was registered; warm-up s: "
        "from the start until the window opened (every trainer had a task accepted: one round of the "
        "queue of N trainers); new call: a GetStatus every 0.5 s through the window, from its first "
        "attempt to its answer (a call the master has not taken up yet waits behind the trainers').")
    for row in rows:
        for who, r in row.items():
            if r.get("errors") or r.get("transient"):
                say(f"  N={r['n']} {who}: transient {r['transient']} errors {r['errors']}")
    return rows


# ---- scenarios ---------------------------------------------------------------------------


async def _revision(endpoint: str) -> int:
    from paddlecloud import etcd
    client = await etcd.connect(endpoint)
    try:
        return (await client.put(b"/paddlecloud-bench/revision-probe", b"")).header.revision
    finally:
        await client.close()


def audit(bench: Bench, job: str, *, start_revision: int, tasks: int, epochs: int) -> dict:
    from paddlecloud.keys import JobKeys
    from tests.etcd_history import audit_done_marks, mark_history

    marks = asyncio.run(mark_history(bench.etcd.endpoint, JobKeys("local", job), "done",
                                     start_revision=start_revision))
    result = audit_done_marks(marks, epochs=epochs, tasks=tasks)
    return {"double": len(result.double_counted), "lost": result.lost_count, "events": len(marks)}


def status(address: str):
    import grpc

    from paddlecloud.api import pb, pb_grpc
    with grpc.insecure_channel(address) as channel:
        return pb_grpc.MasterStub(channel).GetStatus(pb.GetStatusRequest(), timeout=5)


def failover(bench: Bench, say, *, versus: bool = False) -> dict:
    """Two masters with default flags (`versus`: plus --failover-versus); the leader SIGKILLed
    at 25% of a one-epoch job."""
    args = bench.args
    n, tasks = args.failover_n, args.failover_tasks
    job = f"failover{'-versus' if versus else ''}-{bench.tag}"
    data = sparse_file(bench.work / f"{job}.dat", tasks)
    start_revision = asyncio.run(_revision(bench.etcd.endpoint)) + 1
    flags = args.failover_flags.split() + (args.failover_versus.split() if versus else [])
    a, _ = bench.master(job, data, 1, *flags, name="a")
    a.wait_serving()
    b, _ = bench.master(job, data, 1, *flags, name="b")
    masters = [a, b]
    clients = Clients(targets=[a.address, b.address], n=n, k=args.clients, prefix="f-",
                      warmup=0.0, duration=3600.0, etcd=bench.etcd.endpoint, job=job)
    killed = serving_at = None
    try:
        clients.go()
        while status(a.address).counts.done < tasks // 4:
            time.sleep(0.05)
        killed = time.time()
        a.kill()
        clients.mark(killed)
        deadline = killed + 120
        while time.time() < deadline and not b.serving(timeout=0.5):
            time.sleep(0.05)
        serving_at = time.time()
        parts = clients.results(timeout=900)
    finally:
        clients.kill()
        for m in masters:
            m.stop()
    r = merge(parts)
    checked = audit(bench, job, start_revision=start_revision, tasks=tasks, epochs=1)
    resumed = sorted(t - killed for t in r["resumed"])
    result = {"n": n, "tasks": tasks, "serving_s": serving_at - killed,
              "all_served_s": resumed[-1] if len(resumed) == n else None, "served_again": len(resumed),
              "first_served_s": resumed[0] if resumed else None,
              "half_served_s": resumed[len(resumed) // 2] if resumed else None,
              "reregistered": r["reregistered"], "transient": dict(r["transient"]),
              "errors": dict(r["errors"]), **checked}
    say(f"Failover: {n} trainers, {tasks:,} tasks, flags {' '.join(flags) or '(defaults: election TTL 10 s, session TTL 30 s)'}, "
        f"leader SIGKILLed at 25%:")
    say(f"  standby SERVING {result['serving_s']:.2f} s after the kill; trainers served again "
        f"{len(resumed)}/{n}, half {result['half_served_s'] or float('nan'):.2f} s and the last "
        f"{result['all_served_s'] or float('nan'):.2f} s after the kill "
        f"(goal: election TTL + {GOALS['failover_over_ttl_s']:g} s); re-registrations {r['reregistered']}; "
        f"lost {checked['lost']}, double-counted {checked['double']} (etcd history, "
        f"{checked['events']:,} done-mark events); errors {dict(r['errors'])}")
    return result


def _after_serving(result: dict) -> str:
    last = result["all_served_s"]
    return "not all served" if last is None else f"{last - result['serving_s']:.2f} s"


def expiry(bench: Bench, say) -> dict:
    """N trainers, V of them in one client process that is SIGKILLed: the survivors' throughput
    while V leases lapse together, and when the victims' tasks are back."""
    args = bench.args
    n, v = args.expiry_n, args.expiry_victims
    job = f"expiry-{bench.tag}"
    data = sparse_file(bench.work / f"{job}.dat", args.chunks)
    flags = ("--session-ttl", f"{args.expiry_ttl:g}s") if args.expiry_ttl else ()
    ttl = args.expiry_ttl or 30.0
    master, metrics = bench.master(job, data, args.epochs, *flags)
    master.wait_serving()
    before = max(2.0, args.duration)
    run_s = args.warmup + before + ttl + 6.0
    survivors = Clients(targets=[master.address], n=n - v, k=args.clients, prefix="s-",
                        warmup=args.warmup, duration=run_s - args.warmup, stop=run_s)
    victim = Clients(targets=[master.address], n=v, k=1, prefix="v-",
                     warmup=args.warmup, duration=run_s - args.warmup, stop=run_s)
    requeued = 'paddlecloud_master_requeues_total{cause="expiry"}'
    try:
        t0 = survivors.go()
        victim.go()
        killed = t0 + args.warmup + before
        time.sleep(max(0.0, killed - time.time()))
        killed = time.time()
        victim.kill()
        last_value, first_at, back_at = scrape(metrics).get(requeued, 0.0), None, None
        while time.time() < t0 + run_s:
            value = scrape(metrics).get(requeued, 0.0)
            if value != last_value:
                last_value, back_at = value, time.time()
                first_at = first_at or back_at
            time.sleep(0.05)
        parts = survivors.results()
    finally:
        survivors.kill()
        victim.kill()
        master.stop()
    r = merge(parts)
    buckets = {int(k): x for k, x in r["buckets"].items()}
    base = [buckets.get(s, 0) for s in range(int(killed - before), int(killed))]
    # whole seconds from 1 s before the first expiry re-queue to 2 s after the last: the lapse
    start, end = (first_at - 1, back_at + 2) if first_at and back_at else (killed + ttl - 1, killed + ttl + 3)
    lapse = [buckets.get(s, 0) for s in range(math.ceil(start), math.floor(end))]
    base_rate = sum(base) / len(base) if base else 0.0
    worst = min(lapse) if lapse else 0
    mean = sum(lapse) / len(lapse) if lapse else 0.0
    result = {"n": n, "victims": v, "ttl_s": ttl, "before_per_s": base_rate, "worst_second": worst,
              "mean_during": mean, "cost": 1 - mean / base_rate if base_rate else float("nan"),
              "worst_cost": 1 - worst / base_rate if base_rate else float("nan"),
              "requeued": last_value, "back_s": (back_at - killed) if back_at else None,
              "errors": dict(r["errors"]), "transient": dict(r["transient"])}
    say(f"Expiry: {v} of {n} sessions in one SIGKILLed client process, session TTL {ttl:g} s:")
    say(f"  survivors {base_rate:,.0f} tasks/s before; {mean:,.0f}/s on average over the {len(lapse)} s around the "
        f"lapse (cost {result['cost']:.0%}; worst second {worst:,}: {result['worst_cost']:.0%}; goal < "
        f"{GOALS['expiry_cost']:.0%}); {last_value:.0f} tasks re-queued by expiry, the last "
        f"{result['back_s'] or float('nan'):.2f} s after the kill (goal: TTL + 1 s)")
    return result


def big(bench: Bench, say) -> dict:
    """A fresh job of --big-tasks tasks: start-up and RSS; the epoch turnover (a new epoch's
    first task); a master rebuilding a --late-tasks epoch with 90% of it done."""
    args = bench.args
    out: dict = {}
    job = f"big-{bench.tag}"
    data = sparse_file(bench.work / f"{job}.dat", args.big_tasks)
    master, _ = bench.master(job, data, 3)
    out["start_s"] = master.wait_serving(timeout=300)
    out["rss_mb"] = rss_mb(master.pid)
    out["turnover_s"] = epoch_turnover(master.address)
    master.stop()
    say(f"Big dataset: {args.big_tasks:,} tasks: fresh job to SERVING {out['start_s']:.2f} s (goal "
        f"{GOALS['start_s']:g} s), master RSS {out['rss_mb']:.0f} MB (goal {GOALS['rss_mb']:g}); epoch "
        f"turnover (RestartEpoch to epoch 1, then its first task, over gRPC) {out['turnover_s']:.3f} s")
    out.update(late_failover(bench, say))
    return out


def epoch_turnover(address: str) -> float:
    """Seconds from a RestartEpoch into epoch 1 (the whole epoch's tasks dealt anew) until a
    registered trainer's GetTask of epoch 1 is answered with a task: the master's epoch
    turnover, as its callers see it."""
    import grpc

    from paddlecloud.api import pb, pb_grpc
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.MasterStub(channel)
        session = stub.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="turnover"), timeout=60).session_id
        started = time.perf_counter()
        stub.RestartEpoch(pb.RestartEpochRequest(epoch=1), timeout=120)
        reply = stub.GetTask(pb.GetTaskRequest(session_id=session, epoch=1), timeout=60)
        took = time.perf_counter() - started
    if reply.outcome != pb.TASK:
        raise RuntimeError(f"epoch 1's first GetTask answered {pb.Outcome.Name(reply.outcome)}, not a task")
    return took


def late_failover(bench: Bench, say) -> dict:
    """A failover late in a --late-tasks epoch with 90% of it marked done in etcd: the leader
    SIGKILLed, its warm standby (already running, as in a real failover) loads every mark."""
    args = bench.args
    out: dict = {}
    job = f"late-{bench.tag}"
    data = sparse_file(bench.work / f"{job}.dat", args.late_tasks)
    flags = args.failover_flags.split()
    ttl = election_ttl(flags)
    first, _ = bench.master(job, data, 1, *flags, name="late-first")
    first.wait_serving(timeout=300)
    first.stop()
    done = args.late_tasks * 9 // 10
    started = time.perf_counter()
    asyncio.run(_mark_done(bench.etcd.endpoint, job, done))
    write_s = time.perf_counter() - started
    leader, _ = bench.master(job, data, 1, *flags, name="late-leader")
    leader.wait_serving(timeout=300)
    standby, _ = bench.master(job, data, 1, *flags, name="late-standby")
    wait_logged(standby, "standby: the leader is", timeout=120)
    wait_logged(standby, "done-mark mirror following", timeout=120)  # as a standby long up is
    killed = time.time()
    leader.kill()
    standby.wait_serving(timeout=300)
    out["late_serving_s"] = time.time() - killed
    out["late_load_s"] = logged_at(standby, "cache loaded") - logged_at(standby, "elected leader")
    import grpc

    from paddlecloud.api import pb, pb_grpc
    started = time.perf_counter()
    with grpc.insecure_channel(standby.address) as channel:
        stub = pb_grpc.MasterStub(channel)
        session = stub.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="late"), timeout=60).session_id
        reply = stub.GetTask(pb.GetTaskRequest(session_id=session, epoch=0), timeout=60)
    out["late_first_task_s"] = out["late_serving_s"] + time.perf_counter() - started
    out["late_rss_mb"] = rss_mb(standby.pid)
    out["late_mirrored"] = "(the standby's mirror)" in standby.log_path.read_text(errors="replace")
    standby.stop()
    # side by side: the same load reading the marks from etcd, by a master without the mirror
    reader, _ = bench.master(job, data, 1, *flags, name="late-reader")
    reader.wait_serving(timeout=300)
    out["late_read_load_s"] = logged_at(reader, "cache loaded") - logged_at(reader, "elected leader")
    reader.stop()
    out["late_outcome"] = pb.Outcome.Name(reply.outcome)
    out["late_election_ttl_s"] = ttl
    say(f"  late failover: {args.late_tasks:,}-task epoch with {done:,} done marks (written in "
        f"{write_s:.1f} s), election TTL {ttl:g} s, the leader SIGKILLed: its standby SERVING "
        f"{out['late_serving_s']:.2f} s after the kill ({out['late_load_s']:.2f} s of it from its "
        f"election to its state loaded, the marks "
        f"{'from its mirror' if out['late_mirrored'] else 'read from etcd'}; a load reading them "
        f"from etcd took {out['late_read_load_s']:.2f} s in the same run), first GetTask answered ({out['late_outcome']}) "
        f"{out['late_first_task_s']:.2f} s after the kill, RSS {out['late_rss_mb']:.0f} MB (goal: "
        f"election TTL + {GOALS['failover_over_ttl_s']:g} s = {ttl + GOALS['failover_over_ttl_s']:g} s)")
    return out


def election_ttl(flags: list[str]) -> float:
    """The --election-ttl among master flags, in seconds (the master's default otherwise)."""
    from paddlecloud.master_settings import default_of
    from paddlecloud.units import parse_duration
    for i, flag in enumerate(flags):
        if flag == "--election-ttl" and i + 1 < len(flags):
            return parse_duration(flags[i + 1])
        if flag.startswith("--election-ttl="):
            return parse_duration(flag.split("=", 1)[1])
    return default_of("election_ttl")


def logged_at(master: Master, text: str) -> float:
    """The wall-clock time of the first line of the master's log holding `text`."""
    for line in master.log_path.read_text(errors="replace").splitlines():
        if text in line:
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    raise RuntimeError(f"{master.log_path} has no line with {text!r}")


def wait_logged(master: Master, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in master.log_path.read_text(errors="replace"):
        if time.monotonic() > deadline or not master.alive():
            raise RuntimeError(f"{master.log_path}: no {text!r} after {timeout:g} s")
        time.sleep(0.05)


async def _mark_done(endpoint: str, job: str, count: int) -> None:
    """Puts `done/0/<task>` for the first `count` tasks, as finished tasks leave them."""
    from paddlecloud import etcd
    from paddlecloud.keys import JobKeys
    keys = JobKeys("local", job)
    client = await etcd.connect(endpoint)
    try:
        gate = asyncio.Semaphore(16)

        async def batch(first: int) -> None:
            async with gate:
                await client.transaction(compare=[], success=[
                    client.transactions.put(keys.done(0, t), b"") for t in range(first, min(first + 128, count))
                ], failure=[])
        await asyncio.gather(*(batch(f) for f in range(0, count, 128)))
    finally:
        await client.close()


def run(args: argparse.Namespace) -> int:
    bench = Bench(args)
    results: dict = {"args": vars(args), "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                                     "python": platform.python_version()}}
    lines: list[str] = []

    def say(line: str = "") -> None:
        lines.append(line)
        print(line, flush=True)

    try:
        bench.start()
        say("paddlecloud scale benchmark" + ("  (--quick: reduced, not for figures)" if args.quick else ""))
        for line in machine_lines(str(bench.work / "etcd")):
            say(line)
        say(f"clients: {args.clients} processes (--clients), one channel per trainer; warm-up "
            f"{args.warmup:g} s (against a master: and until every trainer had a task accepted), "
            f"window {args.duration:g} s; master: {args.steady_flags or 'default flags'} + --input <sparse "
            f"file> --chunk-bytes 1 --epochs {args.epochs} --metrics-port; its trainers ask max_tasks "
            f"{args.max_tasks}, {'unary (--unary: the servers refuse GetTaskStream)' if args.unary else 'over one GetTaskStream each'}, "
            f"and so do the no-op server's and the baseline's; every trainer is paddlecloud.master_client's connection "
            f"and session, as trainer_agent runs them; each row the median of {args.repeat} interleaved runs"
            + (f"; baseline tree {args.baseline}" if args.baseline else ""))
        data = sparse_file(bench.work / "main.dat", args.chunks)
        bench.start_noop(str(data))
        say()
        results["rows"] = steady_rows(bench, data, say) if args.ns else []
        if not args.no_failover:
            say()
            results["failover"] = failover(bench, say)
            if args.failover_versus:
                say()
                results["failover_versus"] = failover(bench, say, versus=True)
                say(f"From the standby serving to the last trainer served: "
                    f"{_after_serving(results['failover'])} with the flags above, "
                    f"{_after_serving(results['failover_versus'])} with {args.failover_versus}")
        if not args.no_expiry:
            say()
            results["expiry"] = expiry(bench, say)
        if not args.no_big:
            say()
            results["big"] = big(bench, say)
        results["text"] = lines
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
        return 0
    finally:
        bench.close()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/scale.py",
        description="One master for up to 10,000 trainers: steady-state rows (with the no-op ceiling "
                    "and a baseline tree), failover, expiry and big-dataset scenarios.")
    parser.add_argument("--quick", action="store_true", help="a smoke run (< 1 minute on 2 cores)")
    parser.add_argument("--ns", type=lambda s: [int(x) for x in s.split(",") if x],
                        help="trainer counts [64,256,1024,4096,10000; --quick 16,64]")
    parser.add_argument("--clients", type=int, default=max(1, (os.cpu_count() or 2) * 3 // 4),
                        help="client processes K sharing the trainers [3/4 of the cores: %(default)s here]")
    parser.add_argument("--warmup", type=float, help="seconds before each window [3; --quick 0.5]")
    parser.add_argument("--duration", type=float, help="seconds measured per run [10; --quick 2]")
    parser.add_argument("--chunks", type=int, help="tasks per epoch of the steady rows [200000; --quick 20000]")
    parser.add_argument("--epochs", type=int, default=100, help="epochs of the steady rows' job [100]")
    parser.add_argument("--repeat", type=int, help="runs per row, interleaved; the median is shown [3; --quick 1]")
    parser.add_argument("--max-tasks", type=int, default=2,
                        help="max_tasks the new master's trainers ask per GetTask (prefetch) [2 = the "
                             "default --max-tasks-per-trainer]; the baseline's ask one")
    parser.add_argument("--unary", action="store_true",
                        help="the masters and the no-op server refuse GetTaskStream (--no-task-streams), so the "
                             "trainers call GetTask unary, as trainer_agent does there [off: over one stream "
                             "per trainer]")
    parser.add_argument("--steady-flags", default="", metavar="FLAGS",
                        help="more master flags for the steady rows, the baseline's too (e.g. '--session-ttl "
                             "10s') [none: the defaults]")
    parser.add_argument("--baseline", metavar="TREE", help="also run the master of this source tree in each row")
    parser.add_argument("--failover-n", type=int, help="trainers of the failover [1024; --quick 32]")
    parser.add_argument("--failover-tasks", type=int, help="tasks of the failover's job [60000; --quick 3000]")
    parser.add_argument("--failover-flags", help="master flags of the failover [none: the defaults; "
                        "--quick '--election-ttl 3s --session-ttl 9s', the same 1:3 ratio, shorter]")
    parser.add_argument("--failover-versus", metavar="FLAGS",
                        help="run the failover again with these flags added, and compare (e.g. "
                             "'--failover-hold 0')")
    parser.add_argument("--expiry-n", type=int, help="trainers of the expiry scenario [1024; --quick 32]")
    parser.add_argument("--expiry-victims", type=int, help="sessions that expire together [100; --quick 4]")
    parser.add_argument("--expiry-ttl", type=float,
                        help="--session-ttl of the expiry scenario [the default, 30 s; --quick 3]")
    parser.add_argument("--big-tasks", type=int, help="tasks of the big fresh job [10000000; --quick 1000000]")
    parser.add_argument("--late-tasks", type=int,
                        help="tasks of the late-failover epoch, 90%% done [1000000; --quick 50000]")
    parser.add_argument("--no-failover", action="store_true")
    parser.add_argument("--no-expiry", action="store_true")
    parser.add_argument("--no-big", action="store_true")
    parser.add_argument("--dir", default="/var/tmp", help="where etcd's data and the datasets go [/var/tmp]")
    parser.add_argument("--allow-tmpfs", action="store_true", help="smoke tests only: figures not durable")
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, etcd data)")
    parser.add_argument("--role", choices=["client"], help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    q = args.quick
    args.ns = args.ns if args.ns is not None else ([16, 64] if q else [64, 256, 1024, 4096, 10000])
    args.warmup = args.warmup if args.warmup is not None else (0.5 if q else 3.0)
    args.duration = args.duration if args.duration is not None else (2.0 if q else 10.0)
    args.repeat = args.repeat or (1 if q else 3)
    args.chunks = args.chunks or (20_000 if q else 200_000)
    args.failover_n = args.failover_n or (32 if q else 1024)
    args.failover_tasks = args.failover_tasks or (3_000 if q else 60_000)
    if args.failover_flags is None:
        args.failover_flags = "--election-ttl 3s --session-ttl 9s" if q else ""
    args.expiry_n = args.expiry_n or (32 if q else 1024)
    args.expiry_victims = args.expiry_victims or (4 if q else 100)
    args.expiry_ttl = args.expiry_ttl if args.expiry_ttl is not None else (3.0 if q else 0.0)
    args.big_tasks = args.big_tasks or (1_000_000 if q else 10_000_000)
    args.late_tasks = args.late_tasks or (50_000 if q else 1_000_000)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.role == "client":
        run_client(json.loads(args.config))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # One TCP connection per trainer: the master holds N sockets, each client its share.
    # The children inherit the raised limit; a hard limit below N + slack is named, not hit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max(args.ns or [0]) + 4096
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard) if hard != resource.RLIM_INFINITY else need, hard))
        if hard != resource.RLIM_INFINITY and hard < need:
            print(f"warning: open files limited to {hard}; {max(args.ns)} trainers need about {need} "
                  "(raise `ulimit -Hn`)", file=sys.stderr)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
