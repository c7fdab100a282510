"""How the master's seams answer: the machine-readable errors a client acts on, read off
real RPCs against real masters; a cache out of step inside an RPC; the election loop's
expected faults and bugs."""

from __future__ import annotations

import asyncio
import heapq
import logging

import aetcd
import grpc
import pytest
from datasets import write_records
from masters import in_process_master, pb, serving_stub, stub, wait_for, wait_serving

from master.config import MasterConfig
from master.server import MasterNode
from paddlecloud import etcd
from paddlecloud.etcd_server import free_port
from paddlecloud.wire import Reason, error_info


async def rpc_error(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call
    return error.value


# ---- google.rpc.ErrorInfo on real RPCs ----------------------------------------------------


async def test_a_standby_names_the_leader_in_the_error_info(tmp_path, start_master):
    write_records(tmp_path / "data", files=1, records_per_file=2)
    first = start_master("--input", str(tmp_path / "data"), name="first")
    await wait_serving(first.address, process=first)
    second = start_master("--input", str(tmp_path / "data"), name="second")
    async with grpc.aio.insecure_channel(second.address) as channel:
        master = stub(channel)

        async def names_the_leader() -> bool:
            try:
                await master.GetStatus(pb.GetStatusRequest(), timeout=2)
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                return error_info(error) == (Reason.NOT_LEADER, {"leader": first.address})
            raise AssertionError("the second master serves while the first leads")
        await wait_for(names_the_leader, message="the standby never named the leader")
        error = await rpc_error(master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="t")))
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert error_info(error) == (Reason.NOT_LEADER, {"leader": first.address})
        assert first.address in error.details()  # the human message stays


@pytest.fixture
async def master(tmp_path, start_master):
    async with serving_stub(start_master, tmp_path / "data", files=1, records_per_file=4) as master:
        yield master


async def test_an_expired_session_says_so_in_the_error_info(master):
    for call in (master.GetTask(pb.GetTaskRequest(session_id=4242, epoch=0)),
                 master.KeepAlive(pb.KeepAliveRequest(session_id=4242))):
        error = await rpc_error(call)
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert error_info(error) == (Reason.SESSION_EXPIRED, {})
        assert "4242" in error.details()


async def test_a_superseded_session_names_its_trainer_in_the_error_info(master):
    old = await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="trainer-7"))
    new = await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="trainer-7"))
    assert new.session_id != old.session_id
    for call in (master.GetTask(pb.GetTaskRequest(session_id=old.session_id, epoch=0)),
                 master.KeepAlive(pb.KeepAliveRequest(session_id=old.session_id))):
        error = await rpc_error(call)
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_info(error) == (Reason.SESSION_SUPERSEDED, {"trainer": "trainer-7"})
    reply = await master.GetTask(pb.GetTaskRequest(session_id=new.session_id, epoch=0))
    assert reply.outcome == pb.TASK


async def test_an_error_that_is_not_the_callers_fault_carries_no_error_info(master):
    error = await rpc_error(master.GetTask(pb.GetTaskRequest(session_id=1, epoch=-1)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(error) is None


# ---- a cache out of step inside an RPC ----------------------------------------------------


@pytest.fixture
async def in_process(tmp_path, etcd_endpoint, job_name):
    """A master in this process, so a test can put the cache out of step behind the machine's back."""
    write_records(tmp_path / "data", files=1, records_per_file=4)
    async with in_process_master(tmp_path / "data", etcd_endpoint, job_name) as (dispatcher, _, master):
        yield dispatcher, master


async def test_an_invalid_transition_in_an_rpc_is_logged_rebuilds_the_cache_and_answers_unavailable(
        in_process, caplog):
    dispatcher, master = in_process
    reg = await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="t0"))
    corrupt = dispatcher.core.state
    heapq.heappush(corrupt._todo._front, (-1, 10**6))  # a task the job does not have: out of step
    with caplog.at_level(logging.ERROR, logger="master.core"):
        error = await rpc_error(master.GetTask(pb.GetTaskRequest(session_id=reg.session_id, epoch=0)))
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
    assert "retry" in error.details()
    assert error_info(error) == (Reason.TRANSIENT, {})  # the master answered: retry it
    logged = [r for r in caplog.records if r.exc_info and "InvalidTransition" in str(r.exc_info[0])]
    assert logged, [r.getMessage() for r in caplog.records]
    await wait_for(lambda: dispatcher.core.state is not corrupt and dispatcher.core.serving,
                   message="the cache was not rebuilt")
    reply = await master.GetTask(pb.GetTaskRequest(session_id=reg.session_id, epoch=0))
    assert reply.outcome == pb.TASK and 0 <= reply.task.id < dispatcher.core.state.num_tasks


async def test_a_registration_whose_lease_lapsed_before_its_write_is_retried_not_a_rebuild(in_process):
    """A master slower than its session TTL: the lease granted for a registration is gone when
    the session's write reaches etcd. The trainer hears RESOURCE_EXHAUSTED (it retries), nothing
    is recorded, and the cache is not rebuilt (etcd's refusal of the write is no store fault)."""
    dispatcher, master = in_process
    store, state = dispatcher.store, dispatcher.core.state
    grant = store.leases.grant

    async def lapsing_grant(ttl: float) -> int:
        lease = await grant(ttl)
        await store.client.revoke_lease(lease)  # as a lapse: etcd no longer has it
        return lease

    store.leases.grant = lapsing_grant
    error = await rpc_error(master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="slow-1")))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    assert "slow-1" in error.details() and "register again" in error.details()
    assert "slow-1" not in dispatcher.core.sessions.by_trainer
    assert await store.client.get(store.keys.trainer("slow-1")) is None
    assert dispatcher.core.state is state and dispatcher.core.serving  # no rebuild
    store.leases.grant = grant
    reg = await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="slow-1"))
    assert (await master.GetTask(pb.GetTaskRequest(session_id=reg.session_id, epoch=0))).outcome == pb.TASK


async def test_a_session_that_lapsed_while_its_trainer_still_called_is_counted_and_named(
        tmp_path, etcd_endpoint, job_name, caplog):
    """A trainer calling after its session lapsed was alive: the master was too slow for its
    TTL (or the trainer paused). The operator sees it in a metric and a warning naming the TTL;
    each such session counts once, and a session the master never had does not count."""
    from master.metrics import REGISTRY

    def lapsed_alive() -> float:
        return REGISTRY.get_sample_value("paddlecloud_master_sessions_lapsed_alive_total") or 0.0

    write_records(tmp_path / "data", files=1, records_per_file=4)
    async with in_process_master(tmp_path / "data", etcd_endpoint, job_name, session_ttl=2) as (
            dispatcher, _, master):
        before = lapsed_alive()
        reg = await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="late-1"))
        # the stimulus: the trainer does not call for longer than its session lives
        await wait_for(lambda: reg.session_id not in dispatcher.core.sessions.by_session,
                       message="the session did not lapse")
        with caplog.at_level(logging.WARNING, logger="master.trainers"):
            late = await rpc_error(master.GetTask(pb.GetTaskRequest(session_id=reg.session_id, epoch=0)))
            again = await rpc_error(master.KeepAlive(pb.KeepAliveRequest(session_id=reg.session_id)))
            never = await rpc_error(master.GetTask(pb.GetTaskRequest(session_id=12345, epoch=0)))
        assert late.code() == again.code() == never.code() == grpc.StatusCode.NOT_FOUND
        assert lapsed_alive() - before == 1
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("lapsed although their trainers still called" in w and "--session-ttl 2s" in w
                   for w in warnings), warnings


async def cancelled_mid_write(dispatcher, master, answer) -> tuple[int, int, int]:
    """A GetTask that finishes a task and is dealt another, cancelled (its trainer's connection
    dropped) while both writes are on the wire; then `answer(send, batch)` answers them.
    (session, finished task, dealt task) once the call and its writes are over."""
    from master.tasks import TaskRef
    committer = dispatcher.store.committer
    reg = await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="doomed"))
    first = (await master.GetTask(pb.GetTaskRequest(session_id=reg.session_id, epoch=0))).task
    send = committer._send

    async def held_send(batch) -> None:  # the stimulus's timing: on the wire until the caller is gone
        await wait_for(lambda: any(write.future.cancelled() for write in batch),
                       message="the cancellation never reached the call's writes")
        await answer(send, batch)

    committer._send = held_send
    call = asyncio.create_task(dispatcher.tasks.get_task(
        reg.session_id, 0, [TaskRef(first.id, 0, first.attempt)], max_tasks=1))
    await wait_for(lambda: committer._sending, message="the call's writes never left")
    dealt = next(iter(dispatcher.core.state.reserved))
    call.cancel()  # the stimulus: the trainer is gone
    with pytest.raises(asyncio.CancelledError):
        await call  # it settles the writes it queued first
    committer._send = send
    return reg.session_id, first.id, dealt


async def test_a_call_cancelled_while_its_writes_are_in_flight_leaves_the_cache_as_etcd_has_it(in_process):
    """etcd applies the writes of a cancelled call all the same, so the cache must take them
    too. Before, the cancellation unmarked them in the cache: it kept the finished task
    pending, dealt it again once the dead session lapsed, and etcd's refusal of that deal
    rebuilt the whole cache (a stall of every trainer)."""
    from master.state import TaskStatus
    dispatcher, master = in_process
    state = dispatcher.core.state
    session, finished, dealt = await cancelled_mid_write(dispatcher, master, lambda send, batch: send(batch))
    snap = await dispatcher.store.load()
    assert finished in snap.done and dealt in snap.assignments  # etcd took both writes
    assert dispatcher.core.state is state, "the cache was rebuilt"
    assert state.status[finished] == TaskStatus.DONE, "etcd counts the task done; the cache does not"
    assert state.held_by(session) == [dealt], "etcd assigned the task; the cache did not"


async def test_a_cancelled_call_whose_writes_failed_still_rebuilds_the_cache(in_process):
    """A write etcd did not answer may have been applied: the cache is rebuilt from etcd, also
    when no caller is left to hear the failure."""
    from master.committer import _fail_all
    from master.store_errors import StoreUnavailable
    dispatcher, master = in_process
    state = dispatcher.core.state

    async def unanswered(send, batch) -> None:
        _fail_all(batch, StoreUnavailable("etcd transaction failed: the test's"))

    await cancelled_mid_write(dispatcher, master, unanswered)
    await wait_for(lambda: dispatcher.core.state is not state and dispatcher.core.serving,
                   message="the cache was not rebuilt")


async def test_a_lease_refresh_etcd_did_not_answer_is_retried_not_a_rebuild(in_process):
    """A KeepAlive whose refresh etcd left unanswered (it ends the keeper's stream under a
    burst of writes) answers UNAVAILABLE, and the trainer retries. Nothing was written, so
    the cache stays: rebuilding it once per such KeepAlive stalled 10,000 trainers."""
    from paddlecloud.etcd import EtcdUnavailable
    dispatcher, master = in_process
    keeper, state = dispatcher.store.leases.keeper, dispatcher.core.state
    reg = await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="kept"))
    refresh = keeper.refresh

    async def unanswered(lease: int, **_) -> int:
        raise EtcdUnavailable(f"etcd did not refresh lease {lease:x} in 10s")

    keeper.refresh = unanswered
    error = await rpc_error(master.KeepAlive(pb.KeepAliveRequest(session_id=reg.session_id)))
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "lease" in error.details(), error.details()
    assert error_info(error) == (Reason.TRANSIENT, {})
    keeper.refresh = refresh
    await master.KeepAlive(pb.KeepAliveRequest(session_id=reg.session_id))  # after any rebuild
    assert dispatcher.core.state is state and dispatcher.core.serving, "the cache was rebuilt"


async def test_the_lease_process_starts_with_the_leader_not_at_the_first_keepalive(in_process):
    """A new leader's first KeepAlives (a failover's) must not wait for a Python to start."""
    dispatcher, _ = in_process
    child = await wait_for(lambda: dispatcher.store.leases.keeper.child, timeout=30,
                           message="no lease process before any trainer called")
    assert child.poll() is None


async def test_a_bug_inside_an_rpc_is_internal_not_invalid_argument(in_process, caplog):
    """Only the dispatcher's own InvalidArgument is the caller's fault; a ValueError from a bug
    is INTERNAL, logged with its traceback."""
    dispatcher, master = in_process
    dispatcher.core.state._status[0] = 200  # no TaskStatus: ListTasks meets a ValueError
    with caplog.at_level(logging.ERROR, logger="master.servicer"):
        error = await rpc_error(master.ListTasks(pb.ListTasksRequest()))
    assert error.code() == grpc.StatusCode.INTERNAL, error.details()
    assert "ValueError" in error.details()
    assert any(r.exc_info for r in caplog.records if r.name == "master.servicer")


# ---- the election loop ------------------------------------------------------------------------


async def test_an_unreachable_etcd_is_retried_with_backoff_and_a_warning(job_name, caplog):
    port = free_port()  # nothing listens there
    config = MasterConfig(job=job_name, namespace="local", etcd_endpoints=f"127.0.0.1:{port}")
    client = aetcd.Client(host="127.0.0.1", port=port, timeout=1)
    node = MasterNode(config, client)
    with caplog.at_level(logging.WARNING, logger="master.server"):
        run = asyncio.create_task(node.run())
        await wait_for(lambda: sum("retrying in" in r.getMessage() for r in caplog.records) >= 2,
                       timeout=30, message="the campaign was not retried")
        assert not run.done()
        node.stopping.set()
        await asyncio.wait_for(run, 30)
    waits = [r.getMessage().rsplit("retrying in ", 1)[1] for r in caplog.records if "retrying in" in r.getMessage()]
    assert waits[:2] == ["0.5s", "1.0s"], waits  # backoff doubles
    assert node.fatal is None and node.exit_code() == 0
    await client.close()


class BuggyNode(MasterNode):
    async def _term(self) -> None:
        raise TypeError("a bug in the master")


async def test_a_bug_in_the_election_loop_is_logged_with_its_traceback_and_exits_non_zero(
        etcd_endpoint, job_name, caplog):
    client = await etcd.connect(etcd_endpoint)
    node = BuggyNode(MasterConfig(job=job_name, namespace="local", etcd_endpoints=etcd_endpoint), client)
    with caplog.at_level(logging.ERROR, logger="master.server"):
        await asyncio.wait_for(node.run(), 30)
    assert isinstance(node.fatal, TypeError)
    assert node.exit_code() == 1
    assert any(r.exc_info and r.exc_info[0] is TypeError for r in caplog.records)
    await client.close()
