"""The behaviours a master for thousands of trainers rests on, pinned on real masters:
a saturated master sheds calls with RESOURCE_EXHAUSTED (never an unexplained
CANCELLED) and the trainer's client retries every transient code; a trainer that
calls often sends no KeepAlive; with default flags a failover costs no trainer its
session. Timings (how fast, how many trainers) live in bench/scale.py, never here."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import AsyncIterator

import grpc
import pytest
from datasets import write_records
from etcd_history import done_marks, per_epoch
from masters import (
    in_process_master,
    metric,
    pb,
    serving_servicer,
    stub,
    wait_for,
    wait_serving,
    wait_until,
)
from test_master_ha import Trainer, leader_and_standby

from paddlecloud.api import pb_grpc
from paddlecloud.etcd_server import free_port
from paddlecloud.keys import JobKeys
from paddlecloud.master_client.discovery import MasterLocator
from paddlecloud.wire import duration
from trainer_agent.client import MasterConnection, Session, TaskClient, retry_delay

# ---- load shedding -------------------------------------------------------------------------


async def test_a_saturated_master_sheds_calls_with_resource_exhausted_never_cancelled(tmp_path, start_master):
    write_records(tmp_path / "data", files=1, records_per_file=4)
    proc = start_master("--input", str(tmp_path / "data"), "--max-calls-in-flight", "1")
    await wait_serving(proc.address, process=proc)
    codes: Counter = Counter()
    details: list[str] = []
    shed: list[grpc.aio.AioRpcError] = []
    async with grpc.aio.insecure_channel(proc.address) as channel:
        master = stub(channel)

        async def register(i: int) -> None:
            try:
                await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id=f"burst-{i}"), timeout=30)
                codes["OK"] += 1
            except grpc.aio.AioRpcError as error:
                codes[error.code().name] += 1
                details.append(error.details())
                shed.append(error)

        async def shed_some() -> bool:
            # Each registration waits on etcd (a lease grant): the others arrive meanwhile.
            await asyncio.gather(*(register(len(details) * 100 + i) for i in range(40)))
            return codes["RESOURCE_EXHAUSTED"] > 0
        await wait_for(shed_some, message=f"no call was shed: {codes}")
        # Inspection is never shed, even right after a burst.
        assert (await master.GetStatus(pb.GetStatusRequest())).has_dataset
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, codes
    assert codes["OK"] > 0
    assert all("master saturated" in d and "--max-calls-in-flight 1" in d for d in details), details[:3]
    # ... with the delay to retry after, which the client follows (jittered x U(0.5, 1.5)).
    assert all(0.5 <= retry_delay(e) <= 1.5 for e in shed), [e.debug_error_string() for e in shed[:1]]


def test_trainers_retry_shed_calls_until_every_one_is_served(tmp_path, start_master):
    write_records(tmp_path / "data", files=1, records_per_file=4)
    metrics_port = free_port()
    proc = start_master("--input", str(tmp_path / "data"), "--max-calls-in-flight", "1",
                        "--metrics-port", str(metrics_port))
    asyncio.run(wait_serving(proc.address, process=proc))
    connection = MasterConnection(MasterLocator(master_endpoint=proc.address), deadline=60)
    sessions: dict[int, int] = {}
    failures: list[BaseException] = []

    def register(i: int) -> None:
        try:
            sessions[i] = connection.register_trainer(f"retrying-{i}").session_id
        except BaseException as error:  # noqa: BLE001  (reported below)
            failures.append(error)

    try:
        rounds = 0
        while metric(metrics_port, 'paddlecloud_master_shed_calls_total{method="RegisterTrainer"}') == 0:
            rounds += 1
            assert rounds <= 20, "the master never shed a call: nothing was retried"
            threads = [threading.Thread(target=register, args=(rounds * 100 + i,)) for i in range(24)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=90)
    finally:
        connection.close()
    assert failures == []
    assert len(set(sessions.values())) == len(sessions) == 24 * rounds  # every shed call was retried


@contextlib.asynccontextmanager
async def connected_to(servicer: pb_grpc.MasterServicer) -> AsyncIterator[MasterConnection]:
    """`servicer` on a real gRPC server on a free port, and a trainer's connection to it."""
    async with serving_servicer(servicer) as address:
        connection = MasterConnection(MasterLocator(master_endpoint=address), deadline=30)
        try:
            yield connection
        finally:
            connection.close()


class Flaky(pb_grpc.MasterServicer):
    """A real gRPC server that fails the first GetTask with `code`, then answers; over a
    stream (the first stream ends with the code), or unary (`stream` False: a master
    without GetTaskStream)."""

    def __init__(self, code: grpc.StatusCode, *, stream: bool) -> None:
        self.code = code
        self.stream = stream
        self.calls = 0

    async def GetTask(self, request, context):
        self.calls += 1
        if self.calls == 1:
            await context.abort(self.code, f"injected {self.code.name}")
        return pb.GetTaskResponse(outcome=pb.WAIT, current_epoch=request.epoch)

    async def GetTaskStream(self, requests, context):
        if not self.stream:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        async for request in requests:
            yield await self.GetTask(request, context)


async def test_a_trainer_whose_calls_are_all_shed_keeps_its_session(tmp_path, etcd_endpoint, job_name):
    """A shed call still refreshes its session's lease: a trainer shed again and again (told to
    wait, then queued again behind thousands) would otherwise lose its session and register
    again, adding load exactly when the master is saturated."""
    write_records(tmp_path / "data", files=1, records_per_file=4)
    async with in_process_master(tmp_path / "data", etcd_endpoint, job_name,
                                 session_ttl=2) as (dispatcher, servicer, master):
        session = (await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="shed"))).session_id
        servicer.max_in_flight = 0  # every trainer call is shed from now on
        shed = 0
        deadline = asyncio.get_running_loop().time() + 5.0  # the stimulus: 2.5 session TTLs of sheds
        while asyncio.get_running_loop().time() < deadline:
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=0))
            assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            shed += 1
            await asyncio.sleep(0.3)  # a trainer's jittered wait before it tries again, shortened
        servicer.max_in_flight = 1024
        reply = await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=0))
    assert reply.outcome == pb.TASK and shed >= 10  # the same session, never expired


async def test_a_new_session_outlives_its_ttl_while_its_first_call_queues(tmp_path, etcd_endpoint, job_name):
    """A registration storm queues a trainer's first GetTask behind the rest of it: a session
    not yet served is refreshed every half TTL, FIRST_CALL_GRACES times, so that first call may
    come late (streams: gRPC takes up one new stream per turn of the loop). Not for ever: a
    session that never calls still ends."""
    from master.trainers import FIRST_CALL_GRACES
    write_records(tmp_path / "data", files=1, records_per_file=4)
    ttl = 3
    async with in_process_master(tmp_path / "data", etcd_endpoint, job_name,
                                 session_ttl=ttl) as (dispatcher, _, master):
        loop = asyncio.get_running_loop()
        registered = loop.time()
        early = (await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="early"))).session_id
        silent = (await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="silent"))).session_id
        late = (FIRST_CALL_GRACES / 2 + 0.5) * ttl  # 2.5 TTLs: between the last refresh and its lapse
        await asyncio.sleep(registered + late - loop.time())  # the stimulus: a first call that late
        reply = await master.GetTask(pb.GetTaskRequest(session_id=early, epoch=0))
        assert reply.outcome == pb.TASK  # the same session, never expired
        await wait_for(lambda: silent not in dispatcher.core.sessions.by_session, timeout=30,
                       message="a session that never called was kept alive")


class HeldThenRefused(pb_grpc.MasterServicer):
    """Answers one KeepAlive UNAVAILABLE per entry of `holds`, each after holding it that many
    seconds (as a standby does, `--failover-hold`; 0: refused at once), then serves."""

    def __init__(self, holds: list[float]) -> None:
        self.holds, self.calls = holds, 0

    async def KeepAlive(self, request, context):
        self.calls += 1
        if self.calls <= len(self.holds):
            await asyncio.sleep(self.holds[self.calls - 1])
            await context.abort(grpc.StatusCode.UNAVAILABLE, "not the leader")
        return pb.KeepAliveResponse(ttl=duration(10))


@pytest.mark.parametrize("holds", [[0.0, 0.0, 0.0], [0.3, 0.3, 0.3], [0.3, 0.0, 0.3]],
                         ids=["refused", "held", "held-then-refused"])
async def test_the_client_s_backoff_counts_the_attempts_since_its_last_wait(holds, monkeypatch):
    """A call a master held has waited already: it is sent again at once, and so is the quick
    attempt after it (the dead leader a standby names), so a trainer cycling between a standby
    and a dead leader through a failover is never one backoff late. Attempts refused at once,
    one after the other, still back off."""
    from paddlecloud.master_client import connection as client
    monkeypatch.setattr(client, "RETRY_CAP", 0.2)  # below the hold
    waits: list[float] = []

    async def recording(seconds: float) -> None:
        waits.append(seconds)
        await asyncio.sleep(seconds)
    monkeypatch.setattr(client, "sleep", recording)
    servicer = HeldThenRefused(holds)
    async with connected_to(servicer) as connection:
        await asyncio.to_thread(connection.keep_alive, 7)
    assert servicer.calls == 4 and len(waits) == 3
    if max(holds):
        assert waits == [0.0, 0.0, 0.0]
    else:
        assert sum(waits) > 0


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                  grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED])
async def test_the_client_retries_every_transient_code(code, stream):
    servicer = Flaky(code, stream=stream)
    async with connected_to(servicer) as connection:
        reply = await asyncio.to_thread(connection.get_task, 7, epoch=3, finished=[])
    assert (reply.outcome, reply.current_epoch, servicer.calls) == (pb.WAIT, 3, 2)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
async def test_a_code_that_is_not_transient_is_not_retried(stream):
    servicer = Flaky(grpc.StatusCode.INVALID_ARGUMENT, stream=stream)
    async with connected_to(servicer) as connection:
        with pytest.raises(grpc.RpcError) as error:
            await asyncio.to_thread(connection.get_task, 7, epoch=3, finished=[])
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and servicer.calls == 1


# ---- keep-alives ---------------------------------------------------------------------------


def test_a_trainer_that_calls_often_sends_no_keepalive_and_an_idle_one_does(tmp_path, start_master):
    write_records(tmp_path / "data", files=1, records_per_file=4)
    metrics_port = free_port()
    proc = start_master("--input", str(tmp_path / "data"), "--session-ttl", "3s",
                        "--metrics-port", str(metrics_port))
    asyncio.run(wait_serving(proc.address, process=proc))
    keepalives = 'paddlecloud_master_rpc_duration_seconds_count{method="KeepAlive"}'
    connection = MasterConnection(MasterLocator(master_endpoint=proc.address), deadline=30)
    session = Session(connection, trainer_id="busy")
    try:
        session.register()
        # GetTask every 0.2 s for four keep-alive periods (ttl/3 = 1 s): each refreshes the session.
        for _ in range(20):
            session.run(lambda s: connection.get_task(s, epoch=0, finished=[]))
            threading.Event().wait(0.2)
        assert metric(metrics_port, keepalives) == 0
        assert session.keepalives == 0
        # Idle: the keep-alive thread keeps the session.
        wait_until(lambda: metric(metrics_port, keepalives) >= 2, timeout=30,
                   message="an idle trainer sent no KeepAlive")
        session.run(lambda s: connection.get_task(s, epoch=0, finished=[]))
        assert session.reregistrations == 0
    finally:
        session.close()
        connection.close()


class Queued(pb_grpc.MasterServicer):
    """A real gRPC server that holds each GetTask until released, as a master holds a call
    queued behind thousands of others; it counts the KeepAlives it hears meanwhile."""

    def __init__(self, ttl_s: int) -> None:
        self.ttl_s = ttl_s
        self.release = asyncio.Event()
        self.keepalives = 0
        self.keepalives_while_held = 0

    async def RegisterTrainer(self, request, context):
        reply = pb.RegisterTrainerResponse(session_id=1, current_epoch=0, num_epochs=1)
        reply.ttl.seconds = self.ttl_s
        return reply

    async def KeepAlive(self, request, context):
        self.keepalives += 1
        self.keepalives_while_held += not self.release.is_set()
        reply = pb.KeepAliveResponse()
        reply.ttl.seconds = self.ttl_s
        return reply

    async def GetTask(self, request, context):
        await self.release.wait()
        return pb.GetTaskResponse(outcome=pb.WAIT, current_epoch=request.epoch)


async def test_a_trainer_whose_call_is_queued_at_the_master_sends_no_keepalive_meanwhile():
    """Under load a master takes calls up seconds after they were sent; the call under way
    refreshes the session when taken up, so a KeepAlive behind it would only add load. Once
    the call is answered and the trainer idles, the KeepAlives come back."""
    servicer = Queued(ttl_s=3)  # a KeepAlive is due ttl/3 = 1 s after the last answered call
    async with connected_to(servicer) as connection:
        session = Session(connection, trainer_id="queued")
        try:
            await asyncio.to_thread(session.register)
            call = asyncio.create_task(asyncio.to_thread(
                session.run, lambda s: connection.get_task(s, epoch=0, finished=[])))
            await asyncio.sleep(2.5)  # the stimulus: the call is held for 2.5 keep-alive periods
            servicer.release.set()
            assert (await call).outcome == pb.WAIT
            await wait_for(lambda: servicer.keepalives >= 1, timeout=30,
                           message="an idle trainer sent no KeepAlive after its call was answered")
        finally:
            session.close()
    assert servicer.keepalives_while_held == 0


# ---- failover with default flags -----------------------------------------------------------


async def test_with_default_flags_a_leader_sigkill_costs_no_trainer_its_session(
        tmp_path, start_master, etcd_endpoint, job_name):
    """Default --session-ttl and --election-ttl: the standby serves the same sessions, so
    no trainer hears SESSION_EXPIRED (Trainer.call raises on it) and nothing is lost or
    counted twice (audited from etcd's history)."""
    write_records(tmp_path / "data", files=30, records_per_file=1)
    args = ("--input", str(tmp_path / "data"), "--epochs", "2")
    masters = [start_master(*args, name="m1"), start_master(*args, name="m2")]
    leader, standby = await leader_and_standby(masters)
    trainers = [Trainer([m.address for m in masters], f"t{i}") for i in range(3)]
    try:
        runs = [asyncio.create_task(t.run()) for t in trainers]
        await wait_for(lambda: all(t.session for t in trainers), message="trainers did not register")
        sessions = [t.session for t in trainers]

        async def some_progress() -> bool:
            async with grpc.aio.insecure_channel(leader.address) as channel:
                return (await stub(channel).GetStatus(pb.GetStatusRequest())).counts.done >= 5
        await wait_for(some_progress, message="no progress before the kill")
        leader.kill()
        await wait_serving(standby.address, process=standby, timeout=90)
        await asyncio.wait_for(asyncio.gather(*runs), 180)
        assert [t.session for t in trainers] == sessions
    finally:
        for t in trainers:
            await t.close()
    counted = per_epoch(await done_marks(etcd_endpoint, JobKeys("local", job_name)))
    assert {e: sorted(c) for e, c in counted.items()} == {e: list(range(30)) for e in range(2)}
    assert all(max(c.values()) == 1 for c in counted.values())


# ---- several tasks per GetTask -------------------------------------------------------------


def test_a_trainer_asking_max_tasks_reads_every_task_once_with_fewer_calls(
        tmp_path, start_master, etcd_endpoint, job_name):
    write_records(tmp_path / "data", files=30, records_per_file=2)  # 30 files: 30 tasks
    metrics_port = free_port()
    proc = start_master("--input", str(tmp_path / "data"), "--epochs", "2", "--max-tasks-per-trainer", "3",
                        "--metrics-port", str(metrics_port))
    asyncio.run(wait_serving(proc.address, process=proc))
    reads: Counter = Counter()
    with TaskClient(trainer_id="batched", locator=MasterLocator(master_endpoint=proc.address),
                    prefetch=False, max_tasks=3) as client:
        for epoch in client.epochs():
            for record in epoch.records():
                reads[(epoch.number, record)] += 1
        assert client.stats["accepted"] == 60 and client.stats["stale"] == 0
    assert len(reads) == 120 and set(reads.values()) == {1}  # 2 epochs x 60 records, each read once
    calls = metric(metrics_port, 'paddlecloud_master_rpc_duration_seconds_count{method="GetTask"}')
    assert 0 < calls <= 30, calls  # one call per task would be 60 and more
    counted = per_epoch(asyncio.run(done_marks(etcd_endpoint, JobKeys("local", job_name))))
    assert {e: sorted(c) for e, c in counted.items()} == {e: list(range(30)) for e in range(2)}
    assert all(max(c.values()) == 1 for c in counted.values())


async def test_an_old_client_that_asks_no_max_tasks_gets_one_task(tmp_path, start_master):
    write_records(tmp_path / "data", files=6, records_per_file=1)
    proc = start_master("--input", str(tmp_path / "data"), "--max-tasks-per-trainer", "3")
    await wait_serving(proc.address, process=proc)
    async with grpc.aio.insecure_channel(proc.address) as channel:
        master = stub(channel)
        session = (await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="old"))).session_id
        old = await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=0))
        assert old.outcome == pb.TASK and len(old.more_tasks) == 0
        # At most the cap, counting the one already held: two more, though five were asked.
        batch = await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=0, max_tasks=5))
    ids = [batch.task.id, *(t.id for t in batch.more_tasks)]
    assert len(ids) == 2 and old.task.id not in ids and len(set(ids)) == 2
