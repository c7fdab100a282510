"""Fault benchmark of the master: how fast the tasks of a dead or departing trainer move on,
how fast a standby master takes over, and whether anything is lost or counted twice.

    python bench/faults.py            # the full run (about 4 minutes)
    python bench/faults.py --quick    # a reduced run for a smoke test (< 60 s)

What runs, each a real process on this machine:
  * etcd (`paddlecloud.etcd_server.EtcdServer`, the flags paddlecloud starts it with, data
    dir on a real disk: tmpfs is refused; fsync on);
  * `paddlecloud master` processes (default flags but the ones named below), a dataset of
    sparse bytes with `--chunk-bytes 1` (one byte = one chunk = one task);
  * trainers: a *victim* is its own Python process (registers, takes 2 tasks — the default
    per-trainer cap — then calls KeepAlive every ttl/3 as trainer_agent does and does
    nothing else); the *poller* and the failover trainers are asyncio clients in this
    process, over real gRPC, one channel each (the failover trainers: `paddlecloud.master_client`).

Re-queue after SIGKILL: the victim is SIGKILLed right after a KeepAlive answered (so its
lease has the whole TTL to run: the worst case), and the poller, a live trainer, calls
GetTask every 10 ms (again at once after a TASK) until it holds both of the victim's tasks.
Measured: kill -> both handed out to the poller; also when etcd deleted the victim's
`trainers/<id>` key (the lease expired), seen through a watch. Each epoch has exactly the
victim's 2 tasks, so nothing else can be handed out; one run per epoch.

After LeaveTrainer: the same, the leaving trainer in this process; measured from the
LeaveTrainer call's return and from its start.

Failover: two masters for one job; N trainers loop GetTask with the previous task
piggybacked as finished (a few ms of "work" per task); the leader is SIGKILLed when a
quarter of the job is done. Each trainer is the client trainer_agent runs
(`paddlecloud.master_client`): it finds the leader through etcd's leader key and a
standby's NOT_LEADER hint, and retries with its own backoff. Measured: kill -> standby health SERVING, kill -> the
first GetTask answered TASK by the standby, kill -> every trainer got a TASK again. After
the job ended, every PUT/DELETE of its `done/<epoch>/<task>` keys is read back from etcd's
history: a task counted twice in an epoch, or an epoch whose last pass misses a task, is
reported. Speed goals live here, never in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    ROOT,
    Master,
    machine_lines,
    refuse_tmpfs,
    sparse_file,
    start_etcd,
    summary,
    table,
)

GOALS = {
    "requeue_over_ttl_s": 1.0,     # kill -> re-queued <= session TTL + 1 s
    "leave_ms": 100.0,             # LeaveTrainer -> re-queued
    "failover_over_ttl_s": 1.0,    # kill -> standby answers TASK <= election TTL + 1 s
    "lost": 0,
    "double": 0,
}
CAP = 2  # --max-tasks-per-trainer default: what a victim holds


# ---- the victim: a trainer process that takes its tasks and then only keeps alive -----------


def run_victim(config: dict) -> None:
    import grpc

    from paddlecloud.api import pb, pb_grpc

    with grpc.insecure_channel(config["target"]) as channel:
        stub = pb_grpc.MasterStub(channel)
        reply = stub.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id=config["trainer"]), timeout=30)
        session, epoch = reply.session_id, reply.current_epoch
        held: list[dict] = []
        while len(held) < CAP:
            got = stub.GetTask(pb.GetTaskRequest(session_id=session, epoch=epoch), timeout=30)
            if got.outcome == pb.TASK:
                if all(h["task"] != got.task.id for h in held):
                    held.append({"task": got.task.id, "epoch": got.task.epoch, "attempt": got.task.attempt})
            elif got.outcome == pb.EPOCH_DONE:
                epoch = got.current_epoch
            elif got.outcome == pb.WAIT:
                time.sleep(got.retry_after.seconds + got.retry_after.nanos / 1e9)
            else:
                raise SystemExit(f"victim: unexpected outcome {pb.Outcome.Name(got.outcome)}")
        print(json.dumps({"session": session, "epoch": epoch, "held": held}), flush=True)
        while True:  # a live trainer: KeepAlive every ttl/3, nothing else
            stub.KeepAlive(pb.KeepAliveRequest(session_id=session), timeout=30)
            print(f"alive {time.monotonic():.6f}", flush=True)
            time.sleep(config["ttl"] / 3)


# ---- the poller: a live trainer that polls GetTask -------------------------------------------


class Poller:
    """A registered trainer in this process: keeps its session alive, polls on a fixed grid."""

    def __init__(self, target: str, trainer: str, ttl: float, period: float) -> None:
        import grpc

        from paddlecloud.api import pb_grpc
        self.channel = grpc.aio.insecure_channel(target)
        self.stub = pb_grpc.MasterStub(self.channel)
        self.trainer, self.ttl, self.period = trainer, ttl, period
        self.session = self.epoch = 0
        self._keepalive: asyncio.Task | None = None

    async def open(self) -> Poller:
        from paddlecloud.api import pb
        reply = await self.stub.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id=self.trainer), timeout=30)
        self.session, self.epoch = reply.session_id, reply.current_epoch
        self._keepalive = asyncio.create_task(self._keep_alive())
        return self

    async def _keep_alive(self) -> None:
        from paddlecloud.api import pb
        while True:
            await asyncio.sleep(self.ttl / 4)
            with contextlib.suppress(Exception):
                await self.stub.KeepAlive(pb.KeepAliveRequest(session_id=self.session), timeout=5)

    async def collect(self, wanted: set[int], epoch: int, timeout: float) -> tuple[dict[int, float], list, int]:
        """Polls GetTask every `period` (at once again after a TASK) until it holds every task
        in `wanted`; returns ({task: monotonic time handed out}, their refs, polls made)."""
        from paddlecloud.api import pb
        got: dict[int, float] = {}
        refs = []
        polls = 0
        deadline = time.monotonic() + timeout
        tick = time.monotonic()
        while len(got) < len(wanted):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.trainer}: tasks {sorted(wanted - set(got))} not handed out "
                                   f"after {timeout:g}s")
            reply = await self.stub.GetTask(pb.GetTaskRequest(session_id=self.session, epoch=epoch), timeout=10)
            now = time.monotonic()
            polls += 1
            if reply.outcome == pb.TASK and reply.task.id in wanted and reply.task.id not in got:
                got[reply.task.id] = now
                refs.append(pb.TaskRef(task_id=reply.task.id, epoch=reply.task.epoch,
                                       attempt=reply.task.attempt))
                continue  # the next may be free already: ask at once
            if reply.outcome == pb.TASK:
                raise RuntimeError(f"{self.trainer}: handed task {reply.task.id}, not one of {sorted(wanted)}")
            if reply.outcome not in (pb.WAIT,):
                raise RuntimeError(f"{self.trainer}: unexpected outcome {pb.Outcome.Name(reply.outcome)}")
            tick = max(tick + self.period, now)
            await asyncio.sleep(tick - now)
        return got, refs, polls

    async def finish(self, refs: list, epoch: int) -> list[int]:
        from paddlecloud.api import pb
        reply = await self.stub.GetTask(pb.GetTaskRequest(session_id=self.session, epoch=epoch,
                                                          finished=refs), timeout=10)
        return list(reply.finished_results)

    async def close(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
        await self.channel.close()


class DeleteWatch:
    """Records when etcd deletes each key under `prefix` (a lease lapsed or was revoked), by the
    rest of its name: `trainers/<id>` keys by trainer id, or the `leader` key as ''."""

    def __init__(self, endpoint: str, prefix: bytes, *, exact: bool = False) -> None:
        self.endpoint, self.prefix, self.exact = endpoint, prefix, exact
        self.deleted: dict[str, float] = {}
        self._task: asyncio.Task | None = None
        self._ready = asyncio.Event()
        self._changed = asyncio.Event()

    async def start(self) -> DeleteWatch:
        self._task = asyncio.create_task(self._run())
        await asyncio.wait_for(self._ready.wait(), 30)
        return self

    async def _run(self) -> None:
        from paddlecloud import etcd
        from paddlecloud.keys import prefix_range_end
        client = await etcd.connect(self.endpoint)
        try:
            watch = await client.watch(self.prefix, range_end=None if self.exact else prefix_range_end(self.prefix))
            self._ready.set()
            async for event in watch:
                if event.kind == "DELETE":
                    name = event.kv.key[len(self.prefix):].decode()
                    self.deleted.setdefault(name, time.monotonic())
                    self._changed.set()
        finally:
            await client.close()

    async def wait_deleted(self, trainer: str, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while trainer not in self.deleted:
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), max(0.0, deadline - time.monotonic()))
            if time.monotonic() >= deadline:
                break
        return self.deleted.get(trainer)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


# ---- the orchestrator ---------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="paddlecloud-faults-", dir=args.dir))
        self.etcd = None
        self.masters: list[Master] = []
        self.victims: list[subprocess.Popen] = []
        self.script = str(Path(__file__).resolve())
        self.tag = f"{os.getpid()}"

    def start_etcd(self) -> None:
        self.etcd = start_etcd(self.work / "etcd")

    def master(self, job: str, data: Path, epochs: int, *extra: str, name: str = "master") -> Master:
        m = Master(job=job, etcd=self.etcd.endpoint, log_dir=self.work, name=name,
                   args=["--input", str(data), "--chunk-bytes", "1", "--epochs", str(epochs), *extra])
        self.masters.append(m.start())
        return m

    def victim(self, target: str, trainer: str, ttl: float) -> subprocess.Popen:
        config = {"target": target, "trainer": trainer, "ttl": ttl}
        process = subprocess.Popen([sys.executable, self.script, "--role", "victim", "--config",
                                    json.dumps(config)], stdout=subprocess.PIPE, text=True,
                                   cwd=str(ROOT))
        self.victims.append(process)
        return process

    def close(self) -> None:
        for process in self.victims:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        for m in self.masters:
            with contextlib.suppress(Exception):
                m.stop()
        if self.etcd is not None:
            self.etcd.stop()
        if not self.args.keep:
            shutil.rmtree(self.work, ignore_errors=True)


async def _read_line(process: subprocess.Popen, timeout: float) -> str:
    line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), timeout)
    if not line:
        raise RuntimeError(f"victim exited with {process.wait()}")
    return line.strip()


# ---- re-queue after SIGKILL ------------------------------------------------------------------


async def requeue_after_kill(bench: Bench, ttl: float, runs: int) -> dict:
    job = f"requeue-ttl{ttl:g}-{bench.tag}"
    data = sparse_file(bench.work / f"{job}.dat", CAP)  # one epoch = the victim's 2 tasks
    master = bench.master(job, data, runs + 2, "--session-ttl", f"{ttl:g}s")
    await asyncio.to_thread(master.wait_serving)
    from paddlecloud.keys import JobKeys
    watch = await DeleteWatch(bench.etcd.endpoint, JobKeys("local", job).kind_prefix("trainers")).start()
    poller = await Poller(master.address, "poller", ttl, bench.args.poll).open()
    results = []
    try:
        for run in range(runs):
            trainer = f"victim-{run}"
            victim = bench.victim(master.address, trainer, ttl)
            held = json.loads(await _read_line(victim, 60))
            alive = float((await _read_line(victim, 60)).split()[1])  # its KeepAlive just answered
            killed = time.monotonic()
            victim.send_signal(signal.SIGKILL)
            await asyncio.to_thread(victim.wait)
            wanted = {h["task"] for h in held["held"]}
            got, refs, polls = await poller.collect(wanted, held["epoch"], timeout=ttl + 60)
            expired = await watch.wait_deleted(trainer, 5)
            finished = await poller.finish(refs, held["epoch"])
            last = max(got.values())
            results.append({
                "kill_s": last - killed, "first_s": min(got.values()) - killed,
                "alive_s": last - alive, "kill_after_alive_ms": (killed - alive) * 1e3,
                "etcd_expiry_s": (expired - killed) if expired else None,
                "expiry_to_requeue_ms": (last - expired) * 1e3 if expired else None,
                "polls": polls, "accepted_after": sum(1 for r in finished if r == 1),
                "attempts": [h["attempt"] for h in held["held"]],
            })
            print(f"  session TTL {ttl:g} s, run {run + 1}: kill -> re-queued {last - killed:.3f} s "
                  f"(etcd expiry at {results[-1]['etcd_expiry_s'] or float('nan'):.3f} s)",
                  file=sys.stderr, flush=True)
    finally:
        await poller.close()
        await watch.stop()
        master.stop()
    kill = [r["kill_s"] for r in results]
    return {
        "ttl_s": ttl, "runs": results, "kill_s": summary(kill),
        "overshoot_s": summary([k - ttl for k in kill]),
        "alive_s": summary([r["alive_s"] for r in results]),
        "etcd_expiry_s": summary([r["etcd_expiry_s"] for r in results if r["etcd_expiry_s"] is not None]),
        "expiry_to_requeue_ms": summary([r["expiry_to_requeue_ms"] for r in results
                                         if r["expiry_to_requeue_ms"] is not None]),
        "goal_met": max(kill) <= ttl + GOALS["requeue_over_ttl_s"],
    }


# ---- re-queue after LeaveTrainer --------------------------------------------------------------


async def requeue_after_leave(bench: Bench, runs: int) -> dict:
    from paddlecloud.api import pb
    job = f"leave-{bench.tag}"
    data = sparse_file(bench.work / f"{job}.dat", CAP)
    master = bench.master(job, data, runs + 2)  # default flags: session TTL 10 s
    await asyncio.to_thread(master.wait_serving)
    poller = await Poller(master.address, "poller", 10.0, bench.args.poll).open()
    results = []
    try:
        for run in range(runs):
            leaver = await Poller(master.address, f"leaver-{run}", 10.0, bench.args.poll).open()
            epoch = leaver.epoch
            held: set[int] = set()
            while len(held) < CAP:
                got = await leaver.stub.GetTask(pb.GetTaskRequest(session_id=leaver.session, epoch=epoch),
                                                timeout=10)
                if got.outcome == pb.TASK:
                    held.add(got.task.id)
                elif got.outcome == pb.EPOCH_DONE:
                    epoch = got.current_epoch
                else:
                    await asyncio.sleep(0.05)
            collecting = asyncio.create_task(poller.collect(held, epoch, timeout=30))
            await asyncio.sleep(5 * bench.args.poll)  # the poller is polling (WAIT) before the leave
            started = time.monotonic()
            await leaver.stub.LeaveTrainer(pb.LeaveTrainerRequest(session_id=leaver.session), timeout=10)
            returned = time.monotonic()
            got_at, refs, polls = await collecting
            await poller.finish(refs, epoch)
            await leaver.close()
            last = max(got_at.values())
            results.append({"from_return_ms": (last - returned) * 1e3, "from_start_ms": (last - started) * 1e3,
                            "call_ms": (returned - started) * 1e3})
    finally:
        await poller.close()
        master.stop()
    ret = [r["from_return_ms"] for r in results]
    return {"runs": results, "from_return_ms": summary(ret),
            "from_start_ms": summary([r["from_start_ms"] for r in results]),
            "call_ms": summary([r["call_ms"] for r in results]),
            "goal_met": max(r["from_start_ms"] for r in results) <= GOALS["leave_ms"]}


# ---- failover ---------------------------------------------------------------------------------


async def done_audit(endpoint: str, job: str, *, start_revision: int, tasks: int, epochs: int) -> dict:
    """Reads every PUT/DELETE of the job's `done/<epoch>/<task>` keys since `start_revision` and
    counts what tests/etcd_history.check_exactly_once asserts: marks created twice while live
    (double-counted), and tasks missing from an epoch's last complete pass (lost)."""
    from paddlecloud.keys import JobKeys
    from tests.etcd_history import audit_done_marks, mark_history

    marks = await mark_history(endpoint, JobKeys("local", job), "done", start_revision=start_revision)
    audit = audit_done_marks(marks, epochs=epochs, tasks=tasks)
    return {"double": len(audit.double_counted), "lost": audit.lost_count, "events": len(marks)}


async def current_revision(endpoint: str) -> int:
    from paddlecloud import etcd
    client = await etcd.connect(endpoint)
    try:
        return (await client.put(b"/paddlecloud-bench/revision-probe", b"")).header.revision
    finally:
        await client.close()


class FailoverTrainers:
    """N trainers, each the client trainer_agent runs (`paddlecloud.master_client`: a
    connection, a session, its task stream), finding the leader as trainer_agent does:
    through etcd's leader key and a standby's NOT_LEADER hint, retrying with its backoff."""

    def __init__(self, addresses: list[str], n: int, work_s: float, *, etcd: str, job: str) -> None:
        from paddlecloud.auth import ClientCredentials
        from paddlecloud.master_client import MasterConnection, MasterLocator, Session
        locator = MasterLocator(etcd_endpoints=etcd, job=job, namespace="local")
        self.addresses = addresses
        self.connections = [MasterConnection(locator, deadline=600, credentials=ClientCredentials(),
                                             observe=self._failed) for _ in range(n)]
        self.sessions = [Session(c, trainer_id=f"trainer-{i}") for i, c in enumerate(self.connections)]
        self.n, self.work_s = n, work_s
        self.accepted: Counter = Counter()       # (epoch, task) -> ACCEPTED answers
        self.stale = 0
        self.errors: Counter = Counter()
        self.killed_at: float | None = None
        self.standby = -1
        self.first_task: dict[int, float] = {}   # trainer -> first TASK from the standby after the kill
        self.first_answer: dict[int, float] = {}  # trainer -> first answer (any outcome) from it
        self.done = 0

    @property
    def reregistered(self) -> int:
        """Sessions registered again after the master said they expired."""
        return sum(s.reregistrations for s in self.sessions)

    def _failed(self, error: BaseException) -> None:
        """Every failed attempt a connection retries, by its code."""
        import grpc
        self.errors[error.code().name if isinstance(error, grpc.RpcError) else type(error).__name__] += 1

    async def trainer(self, i: int) -> None:
        from paddlecloud.api import pb
        from paddlecloud.wire import seconds
        connection, session = self.connections[i], self.sessions[i]
        epoch = (await session.register()).current_epoch
        previous: list = []
        while True:
            reply = await session.run(lambda s, acks=previous, epoch=epoch: connection.get_task(
                s, epoch=epoch, finished=acks))
            now = time.monotonic()
            at_standby = self.killed_at is not None and connection.address == self.addresses[self.standby]
            if at_standby and i not in self.first_answer:
                self.first_answer[i] = now
            for ref, result in zip(previous, reply.finished_results, strict=False):
                if result == pb.ACCEPTED:
                    self.accepted[(ref.epoch, ref.task_id)] += 1
                    self.done += 1
                else:
                    self.stale += 1
            previous = []
            if reply.outcome == pb.TASK:
                if at_standby and i not in self.first_task:
                    self.first_task[i] = now
                t = reply.task
                previous = [pb.TaskRef(task_id=t.id, epoch=t.epoch, attempt=t.attempt)]
                await asyncio.sleep(self.work_s)
            elif reply.outcome == pb.WAIT:
                await asyncio.sleep(seconds(reply.retry_after) * random.uniform(0.5, 1.5))
            elif reply.outcome == pb.EPOCH_DONE:
                epoch = reply.current_epoch
            elif reply.outcome == pb.JOB_DONE:
                return
            else:
                raise RuntimeError(f"trainer-{i}: {pb.Outcome.Name(reply.outcome)}")

    async def close(self) -> None:
        for session in self.sessions:
            session.close()
        await asyncio.gather(*(c.close() for c in self.connections))


async def failover_run(bench: Bench, election_ttl: float, session_ttl: float, run: int) -> dict:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    args = bench.args
    job = f"failover-e{election_ttl:g}-s{session_ttl:g}-{run}-{bench.tag}"
    data = sparse_file(bench.work / f"{job}.dat", args.failover_tasks)
    start_revision = await current_revision(bench.etcd.endpoint) + 1
    flags = ("--election-ttl", f"{election_ttl:g}s", "--session-ttl", f"{session_ttl:g}s")
    first = bench.master(job, data, args.failover_epochs, *flags, name="a")
    await asyncio.to_thread(first.wait_serving)
    second = bench.master(job, data, args.failover_epochs, *flags, name="b")

    async def responding(m: Master) -> None:  # the standby's server is up (NOT_SERVING)
        async with grpc.aio.insecure_channel(m.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for _ in range(3000):
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                    return
                await asyncio.sleep(0.02)
            raise RuntimeError(f"standby {m.address} never answered")
    await responding(second)
    await asyncio.sleep(0.3)  # let it campaign and watch the leader key
    masters = [first, second]
    trainers = FailoverTrainers([m.address for m in masters], args.failover_trainers, args.work_ms / 1e3,
                                etcd=bench.etcd.endpoint, job=job)
    total = args.failover_tasks * args.failover_epochs
    workers = [asyncio.create_task(trainers.trainer(i)) for i in range(trainers.n)]
    leader_watch = None
    try:
        while trainers.done < total // 4:
            if any(w.done() for w in workers):
                break
            await asyncio.sleep(0.01)
        leader = 0 if await asyncio.to_thread(first.serving) else 1
        standby = masters[1 - leader]
        trainers.standby = 1 - leader
        done_before = trainers.done
        from paddlecloud.keys import JobKeys
        leader_watch = await DeleteWatch(bench.etcd.endpoint, JobKeys("local", job).leader, exact=True).start()
        trainers.killed_at = killed = time.monotonic()
        masters[leader].kill()

        serving_at = None
        async with grpc.aio.insecure_channel(standby.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            deadline = killed + election_ttl + 60
            while time.monotonic() < deadline:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        serving_at = time.monotonic()
                        break
                await asyncio.sleep(args.poll)
        await asyncio.wait_for(asyncio.gather(*workers), timeout=election_ttl + session_ttl + 120)
    finally:
        for w in workers:
            w.cancel()
        await trainers.close()
        expired = None
        if leader_watch is not None:
            expired = leader_watch.deleted.get("")
            await leader_watch.stop()
        for m in masters:
            m.stop()
    checked = await done_audit(bench.etcd.endpoint, job, start_revision=start_revision,
                               tasks=args.failover_tasks, epochs=args.failover_epochs)
    firsts = sorted(trainers.first_task.values())
    client_double = sum(1 for n in trainers.accepted.values() if n > 1)
    result = {
        "election_ttl_s": election_ttl, "session_ttl_s": session_ttl, "run": run,
        "serving_s": (serving_at - killed) if serving_at else None,
        "first_task_s": (firsts[0] - killed) if firsts else None,
        "leader_expiry_s": (expired - killed) if expired else None,
        "expiry_to_task_ms": (firsts[0] - expired) * 1e3 if expired and firsts else None,
        "all_resumed_s": (max(trainers.first_answer.values()) - killed)
        if len(trainers.first_answer) == trainers.n else None,
        "trainers_resumed": len(firsts), "done_before_kill": done_before, "tasks_total": total,
        "lost": checked["lost"], "double": checked["double"], "done_events": checked["events"],
        "client_accepted_twice": client_double, "client_accepted": sum(trainers.accepted.values()),
        "stale": trainers.stale, "reregistered": trainers.reregistered, "errors": dict(trainers.errors),
    }
    print(f"  election TTL {election_ttl:g} s, session TTL {session_ttl:g} s, run {run + 1}: "
          f"kill -> standby TASK {result['first_task_s'] or float('nan'):.3f} s; lost {checked['lost']}, "
          f"double-counted {checked['double']}", file=sys.stderr, flush=True)
    return result


async def failover(bench: Bench, election_ttl: float, session_ttl: float, runs: int, etcd_late: float) -> dict:
    """`etcd_late`: how long past its TTL etcd let a lease refreshed just before a kill live (the
    worst of the re-queue runs): the leader's lease, refreshed every ttl/3, may be that too."""
    results = [await failover_run(bench, election_ttl, session_ttl, run) for run in range(runs)]
    firsts = [r["first_task_s"] for r in results if r["first_task_s"] is not None]
    reaction = [r["expiry_to_task_ms"] for r in results if r["expiry_to_task_ms"] is not None]
    worst = election_ttl + etcd_late + max(reaction, default=float("nan")) / 1e3
    ok = (len(firsts) == len(results) and max(firsts) <= election_ttl + GOALS["failover_over_ttl_s"]
          and worst <= election_ttl + GOALS["failover_over_ttl_s"])
    return {
        "election_ttl_s": election_ttl, "session_ttl_s": session_ttl, "runs": results,
        "serving_s": summary([r["serving_s"] for r in results if r["serving_s"] is not None]),
        "first_task_s": summary(firsts),
        "overshoot_s": summary([f - election_ttl for f in firsts]),
        "leader_expiry_s": summary([r["leader_expiry_s"] for r in results if r["leader_expiry_s"] is not None]),
        "expiry_to_task_ms": summary(reaction), "etcd_late_s": etcd_late, "worst_case_s": worst,
        "all_resumed_s": summary([r["all_resumed_s"] for r in results if r["all_resumed_s"] is not None]),
        "lost": sum(r["lost"] for r in results), "double": sum(r["double"] for r in results),
        "reregistered": sum(r["reregistered"] for r in results),
        "stale": sum(r["stale"] for r in results),
        "goal_met": ok,
    }


# ---- output -----------------------------------------------------------------------------------


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None or x != x else format(x, spec)


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def report(results: dict, say) -> None:
    args = results["args"]
    say()
    say(f"Re-queue after SIGKILL of a trainer: the victim holds {CAP} tasks and is killed right after "
        f"its KeepAlive answered; a live trainer polls GetTask every {args['poll'] * 1e3:g} ms; "
        f"{args['repeat']} runs per TTL")
    rows = []
    for r in results["requeue"]:
        rows.append([f"{r['ttl_s']:g}", str(len(r["runs"])), fmt(r["kill_s"]["median"]), fmt(r["kill_s"]["max"]),
                     fmt(r["overshoot_s"]["median"], "+.2f"), fmt(r["overshoot_s"]["max"], "+.2f"),
                     f"{r['kill_s']['median'] / r['ttl_s']:.2f}",
                     fmt(r["etcd_expiry_s"]["median"]), fmt(r["expiry_to_requeue_ms"]["median"], ".0f"),
                     fmt(r["expiry_to_requeue_ms"]["max"], ".0f"), verdict(r["goal_met"])])
    for line in table(["session TTL s", "runs", "kill->re-queued median s", "max s",
                       "past TTL median s", "past TTL max s", "median/TTL",
                       "kill->etcd lease expiry median s", "expiry->handed out median ms", "max ms",
                       "goal TTL+1 s"], rows):
        say(line)
    say("  re-queued: both of the victim's tasks handed out to the poller; etcd lease expiry: the watch")
    say("  saw etcd delete the victim's trainers/<id> key (its lease lapsed)")

    lv = results["leave"]
    say()
    say(f"Re-queue after LeaveTrainer ({CAP} tasks held; the poller polls GetTask every "
        f"{args['poll'] * 1e3:g} ms), {len(lv['runs'])} runs:")
    say(f"  from the call's return: median {lv['from_return_ms']['median']:.1f} ms, max "
        f"{lv['from_return_ms']['max']:.1f} ms; from its start: median {lv['from_start_ms']['median']:.1f} ms, "
        f"max {lv['from_start_ms']['max']:.1f} ms; the LeaveTrainer call itself: median "
        f"{lv['call_ms']['median']:.1f} ms")

    say()
    say(f"Failover: two masters, {args['failover_trainers']} trainers looping GetTask + finish "
        f"({args['work_ms']:g} ms of work per task) over {args['failover_tasks']} tasks x "
        f"{args['failover_epochs']} epochs; the leader SIGKILLed a quarter into the job; each trainer "
        f"the client trainer_agent runs (paddlecloud.master_client: the leader from etcd, its backoff)")
    rows = []
    for f in results["failover"]:
        rows.append([f"{f['election_ttl_s']:g}", f"{f['session_ttl_s']:g}", str(len(f["runs"])),
                     fmt(f["leader_expiry_s"]["median"]), fmt(f["serving_s"]["median"]),
                     fmt(f["first_task_s"]["median"]), fmt(f["first_task_s"]["max"]),
                     fmt(f["expiry_to_task_ms"]["median"], ".0f"), fmt(f["expiry_to_task_ms"]["max"], ".0f"),
                     fmt(f["worst_case_s"]), fmt(f["all_resumed_s"]["max"]),
                     str(f["reregistered"]), str(f["lost"]), str(f["double"]), verdict(f["goal_met"])])
    for line in table(["election TTL s", "session TTL s", "runs", "kill->leader key expired median s",
                       "kill->standby SERVING median s", "kill->standby TASK median s", "max s",
                       "expired->TASK median ms", "max ms", "worst case s", "every trainer answered max s",
                       "re-registered", "lost", "double-counted", "goal TTL+1 s"], rows):
        say(line)
    say("  the leader refreshes its election lease every ttl/3, so a kill finds it up to ttl/3 old: kill->TASK")
    say("  runs from 2/3 TTL up. worst case = TTL + the most etcd let a just-refreshed lease outlive its TTL")
    say("  (re-queue runs above) + the most the standby took from the leader key's expiry to a TASK answer")
    say("  lost / double-counted: from etcd's history of the job's done/<epoch>/<task> keys, every epoch")

    say()
    say("Goals" + ("  [--quick: sizes reduced, not a verdict]" if args["quick"] else ""))
    for r in results["requeue"]:
        say(f"  re-queue after SIGKILL <= session TTL + 1 s at TTL {r['ttl_s']:g} s: max "
            f"{r['kill_s']['max']:.2f} s (median {r['kill_s']['median']:.2f} s)  {verdict(r['goal_met'])}")
    say(f"  re-queue after LeaveTrainer <= {GOALS['leave_ms']:g} ms: max {lv['from_start_ms']['max']:.1f} ms "
        f"from the call's start  {verdict(lv['goal_met'])}")
    for f in results["failover"]:
        say(f"  failover <= election TTL + 1 s at TTL {f['election_ttl_s']:g} s (session TTL "
            f"{f['session_ttl_s']:g} s): max {fmt(f['first_task_s']['max'])} s measured, worst case "
            f"{fmt(f['worst_case_s'])} s  {verdict(f['goal_met'])}")
    lost = sum(f["lost"] for f in results["failover"])
    double = sum(f["double"] for f in results["failover"])
    say(f"  tasks lost across failovers: {lost}  {verdict(lost == 0)}")
    say(f"  tasks double-counted across failovers: {double}  {verdict(double == 0)}")


async def run_all(args: argparse.Namespace, bench: Bench, say) -> dict:
    results: dict = {"args": {k: v for k, v in vars(args).items() if k not in ("role", "config")}}
    results["requeue"] = [await requeue_after_kill(bench, ttl, args.repeat) for ttl in args.ttls]
    results["leave"] = await requeue_after_leave(bench, args.leave_repeat)
    results["failover"] = []
    late = max(r["etcd_expiry_s"]["max"] - r["ttl_s"] for r in results["requeue"])
    for election_ttl in args.election_ttls:
        session_ttl = max(10.0, 2 * election_ttl)
        results["failover"].append(await failover(bench, election_ttl, session_ttl, args.failover_repeat, late))
    if args.defaults_failover:
        results["failover"].append(await failover(bench, 10.0, 10.0, args.defaults_failover, late))
    return results


def run(args: argparse.Namespace) -> int:
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    refuse_tmpfs(args.dir, args.allow_tmpfs)
    bench = Bench(args)

    def say(line: str = "") -> None:
        print(line, flush=True)

    try:
        bench.start_etcd()
        say("paddlecloud fault benchmark" + ("  (--quick: reduced, not for figures)" if args.quick else ""))
        head = machine_lines(str(bench.work / "etcd"))
        for line in head:
            say(line)
        say("master: `paddlecloud master` default flags + --input <sparse file> --chunk-bytes 1 --epochs E "
            "(+ the TTLs named below; max 2 tasks per trainer; logs at INFO)")
        started = time.monotonic()
        results = asyncio.run(run_all(args, bench, say))
        results["header"] = head
        results["elapsed_s"] = time.monotonic() - started
        results["goals"] = GOALS
        report(results, say)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        return 0
    finally:
        bench.close()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    def floats(text: str) -> list[float]:
        return [float(x) for x in text.split(",") if x]

    parser = argparse.ArgumentParser(
        prog="bench/faults.py",
        description="Re-queue latency after a trainer's SIGKILL and LeaveTrainer, master failover "
                    "time, and tasks lost or double-counted across a failover.")
    parser.add_argument("--quick", action="store_true", help="reduced run for a smoke test (< 60 s)")
    parser.add_argument("--ttls", type=floats, help="session TTLs for the SIGKILL re-queue [2,5,10; --quick 2]")
    parser.add_argument("--repeat", type=int, help="runs per session TTL [5; --quick 1]")
    parser.add_argument("--leave-repeat", type=int, help="LeaveTrainer runs [15; --quick 3]")
    parser.add_argument("--election-ttls", type=floats, help="election TTLs for the failover [2,5,10; --quick 2]")
    parser.add_argument("--failover-repeat", type=int, help="failovers per election TTL [3; --quick 1]")
    parser.add_argument("--defaults-failover", type=int,
                        help="also fail over with the default TTLs (election 10 s = session 10 s), K runs "
                             "[1; --quick 0]")
    parser.add_argument("--failover-trainers", type=int, default=8, help="trainers in the failover job [8]")
    parser.add_argument("--failover-tasks", type=int, help="tasks per epoch of the failover job [400; --quick 100]")
    parser.add_argument("--failover-epochs", type=int, default=3, help="epochs of the failover job [3]")
    parser.add_argument("--work-ms", type=float, default=10.0, help="a failover trainer's work per task [10]")
    parser.add_argument("--poll", type=float, default=0.010, help="GetTask poll / retry period, seconds [0.010]")
    parser.add_argument("--dir", default="/var/tmp", help="where the etcd data dir goes: a real disk [/var/tmp]")
    parser.add_argument("--allow-tmpfs", action="store_true",
                        help="run even if --dir is on tmpfs (smoke tests only: figures not durable)")
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, etcd data)")
    parser.add_argument("--role", choices=["victim"], help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    q = args.quick
    args.ttls = args.ttls or ([2.0] if q else [2.0, 5.0, 10.0])
    args.repeat = args.repeat or (1 if q else 5)
    args.leave_repeat = args.leave_repeat or (3 if q else 15)
    args.election_ttls = args.election_ttls or ([2.0] if q else [2.0, 5.0, 10.0])
    args.failover_repeat = args.failover_repeat or (1 if q else 3)
    if args.defaults_failover is None:
        args.defaults_failover = 0 if q else 1
    args.failover_tasks = args.failover_tasks or (100 if q else 400)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.role == "victim":
        run_victim(json.loads(args.config))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
