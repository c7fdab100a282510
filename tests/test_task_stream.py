"""GetTaskStream: GetTask many times over one stream, each request answered exactly as a
unary GetTask would be. The trainer's client keeps one stream per session at its master,
opens another after any failure, and calls GetTask unary at a master without streams."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest
from datasets import write_records
from masters import in_process_master, pb, stub, wait_serving
from test_scale_behaviours import connected_to, metric
from waiting import wait_until

from paddlecloud.api import pb_grpc
from paddlecloud.etcd_server import free_port
from paddlecloud.master_client import connection as trainer_client
from paddlecloud.master_client.discovery import MasterLocator
from paddlecloud.wire import Reason, error_info, seconds
from trainer_agent.client import MasterConnection, Session


async def test_one_stream_reads_a_whole_job_its_acks_riding_on_the_next_request(tmp_path, start_master):
    write_records(tmp_path / "data", files=6, records_per_file=2)  # a task per file
    metrics_port = free_port()
    proc = start_master("--input", str(tmp_path / "data"), "--epochs", "2", "--metrics-port", str(metrics_port))
    await wait_serving(proc.address, process=proc)
    async with grpc.aio.insecure_channel(proc.address) as channel:
        master = stub(channel)
        registered = await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="streaming"))
        session, epoch = registered.session_id, registered.current_epoch
        call = master.GetTaskStream()
        acks: list[pb.TaskRef] = []
        dealt: dict[int, list[int]] = {0: [], 1: []}
        results: list[int] = []
        while True:
            await call.write(pb.GetTaskRequest(session_id=session, epoch=epoch, finished=acks, max_tasks=2))
            reply = await call.read()
            assert list(reply.finished_results) == [pb.ACCEPTED] * len(acks), reply
            results.extend(reply.finished_results)
            acks = []
            if reply.outcome == pb.JOB_DONE:
                break
            if reply.outcome == pb.EPOCH_DONE:
                epoch = reply.current_epoch
            elif reply.outcome == pb.WAIT:
                await asyncio.sleep(seconds(reply.retry_after))
            else:
                assert reply.outcome == pb.TASK, reply
                for task in (reply.task, *reply.more_tasks):
                    dealt[task.epoch].append(task.id)
                    acks.append(pb.TaskRef(task_id=task.id, epoch=task.epoch, attempt=task.attempt))
        assert metric(metrics_port, "paddlecloud_master_task_streams") == 1  # still open
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
        status = await master.GetStatus(pb.GetStatusRequest())
    assert sorted(dealt[0]) == sorted(dealt[1]) == list(range(6))  # each task once per epoch
    assert len(results) == 12 and status.phase == "Succeeded"
    assert metric(metrics_port, "paddlecloud_master_task_streams_opened_total") == 1
    wait_until(lambda: metric(metrics_port, "paddlecloud_master_task_streams") == 0,
               message="the stream ended but the master still counts it open")


async def test_an_error_ends_the_stream_with_the_status_and_reason_get_task_would_answer(
        tmp_path, etcd_endpoint, job_name):
    write_records(tmp_path / "data", files=1, records_per_file=2)
    async with in_process_master(tmp_path / "data", etcd_endpoint, job_name) as (_, _, master):
        session = (await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="t"))).session_id
        call = master.GetTaskStream()
        await call.write(pb.GetTaskRequest(session_id=session, epoch=0))
        assert (await call.read()).outcome == pb.TASK
        await call.write(pb.GetTaskRequest(session_id=session, epoch=-3))
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await call.read()
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "-3" in bad.value.details()

        await master.LeaveTrainer(pb.LeaveTrainerRequest(session_id=session))
        call = master.GetTaskStream()  # the next call, on a new stream, of a session gone
        await call.write(pb.GetTaskRequest(session_id=session, epoch=0))
        with pytest.raises(grpc.aio.AioRpcError) as expired:
            await call.read()
        assert expired.value.code() == grpc.StatusCode.NOT_FOUND
        assert error_info(expired.value) == (Reason.SESSION_EXPIRED, {})


def test_a_trainer_keeps_one_stream_for_its_session_and_a_new_one_for_a_new_session(tmp_path, start_master):
    write_records(tmp_path / "data", files=6, records_per_file=2)
    metrics_port = free_port()
    proc = start_master("--input", str(tmp_path / "data"), "--metrics-port", str(metrics_port))
    asyncio.run(wait_serving(proc.address, process=proc))
    connection = MasterConnection(MasterLocator(master_endpoint=proc.address), deadline=30)
    session = Session(connection, trainer_id="keeper")
    try:
        session.register()
        acks: list[pb.TaskRef] = []
        for _ in range(3):
            reply = session.run(lambda s, acks=acks: connection.get_task(s, epoch=0, finished=acks))
            assert reply.outcome == pb.TASK, reply
            acks = [pb.TaskRef(task_id=reply.task.id, epoch=0, attempt=reply.task.attempt)]
        assert metric(metrics_port, "paddlecloud_master_task_streams_opened_total") == 1
        first = session.id
        connection.leave_trainer(first, timeout=10)  # the session ends: the next call registers again
        reply = session.run(lambda s: connection.get_task(s, epoch=0, finished=[]))
        assert reply.outcome == pb.TASK and session.id != first
        # the old stream answered NOT_FOUND and ended; the new session has a stream of its own
        assert metric(metrics_port, "paddlecloud_master_task_streams_opened_total") == 2
    finally:
        session.close()
        connection.close()
    wait_until(lambda: metric(metrics_port, "paddlecloud_master_task_streams") == 0,
               message="the closed connection's stream is still open at the master")
    wait_until(lambda: not [t for t in threading.enumerate() if t.name.startswith("task-stream-")],
               message="a task stream's thread outlived its connection")


class Unary(pb_grpc.MasterServicer):
    """A master from before GetTaskStream: the stream is UNIMPLEMENTED, GetTask answers."""

    def __init__(self) -> None:
        self.streams = self.calls = 0

    async def GetTaskStream(self, requests, context):
        self.streams += 1
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        yield  # an async generator, as a stream's handler is

    async def GetTask(self, request, context):
        self.calls += 1
        return pb.GetTaskResponse(outcome=pb.WAIT, current_epoch=request.epoch)


async def test_a_master_without_streams_is_asked_once_then_called_unary():
    servicer = Unary()
    async with connected_to(servicer) as connection:
        for _ in range(3):
            reply = await asyncio.to_thread(connection.get_task, 7, epoch=0, finished=[])
            assert reply.outcome == pb.WAIT
    assert (servicer.streams, servicer.calls) == (1, 3)


async def test_a_master_with_task_streams_off_is_called_unary(tmp_path, start_master):
    """--no-task-streams: GetTaskStream answers UNIMPLEMENTED, naming the flag, and a trainer
    gets its tasks by unary GetTask (its fallback for a master without streams)."""
    write_records(tmp_path / "data", files=2, records_per_file=1)
    metrics_port = free_port()
    proc = start_master("--input", str(tmp_path / "data"), "--no-task-streams", "--metrics-port", str(metrics_port))
    await wait_serving(proc.address, process=proc)
    async with grpc.aio.insecure_channel(proc.address) as channel:
        call = stub(channel).GetTaskStream()  # refused before any request: none is written, for
        # a write racing the refusal would report grpc.aio's INTERNAL instead of its status
        assert await asyncio.wait_for(call.code(), 30) == grpc.StatusCode.UNIMPLEMENTED
        assert "--no-task-streams" in await call.details()
    connection = MasterConnection(MasterLocator(master_endpoint=proc.address), deadline=30)
    try:
        session = await asyncio.to_thread(lambda: connection.register_trainer("unary-1").session_id)
        replies = [await asyncio.to_thread(connection.get_task, session, epoch=0, finished=[]) for _ in range(2)]
    finally:
        connection.close()
    assert [r.outcome for r in replies] == [pb.TASK, pb.TASK]
    assert metric(metrics_port, 'paddlecloud_master_rpc_duration_seconds_count{method="GetTask"}') == 2
    assert metric(metrics_port, "paddlecloud_master_task_streams_opened_total") == 0


class Stalling(pb_grpc.MasterServicer):
    """Its first stream never answers (a master stuck, a connection half gone); later ones do."""

    def __init__(self) -> None:
        self.streams = 0
        self.stalled_ended = asyncio.Event()

    async def GetTaskStream(self, requests, context):
        self.streams += 1
        if self.streams == 1:
            try:
                await asyncio.Event().wait()
            finally:
                self.stalled_ended.set()
        async for request in requests:
            yield pb.GetTaskResponse(outcome=pb.WAIT, current_epoch=request.epoch)


async def test_a_stream_that_does_not_answer_in_time_is_dropped_and_the_call_retried_on_a_new_one(monkeypatch):
    monkeypatch.setattr(trainer_client, "CALL_TIMEOUT", 1.0)
    servicer = Stalling()
    async with connected_to(servicer) as connection:
        reply = await asyncio.to_thread(connection.get_task, 7, epoch=4, finished=[])
        assert reply.outcome == pb.WAIT and reply.current_epoch == 4
        assert servicer.streams == 2
        await asyncio.wait_for(servicer.stalled_ended.wait(), 30)  # the client cancelled it


async def test_a_streams_get_tasks_wait_their_turn_where_unary_calls_would_be_shed(tmp_path, start_master):
    """With one call in flight allowed, 40 trainers' GetTasks at once over their streams are
    all answered (none RESOURCE_EXHAUSTED): shedding a stream would cost it a new one."""
    write_records(tmp_path / "data", files=50, records_per_file=1)
    proc = start_master("--input", str(tmp_path / "data"), "--max-calls-in-flight", "1")
    await wait_serving(proc.address, process=proc)
    async with grpc.aio.insecure_channel(proc.address) as channel:
        master = stub(channel)
        sessions = [(await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id=f"t{i}"))).session_id
                    for i in range(40)]  # one at a time: none shed

        async def first_task(session: int) -> pb.GetTaskResponse:
            call = master.GetTaskStream()
            await call.write(pb.GetTaskRequest(session_id=session, epoch=0))
            reply = await call.read()
            await call.done_writing()
            return reply

        replies = await asyncio.gather(*(first_task(s) for s in sessions))
    assert [r.outcome for r in replies] == [pb.TASK] * 40
    assert len({r.task.id for r in replies}) == 40
