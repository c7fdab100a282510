"""RestartEpoch of a job whose data is all consumed.

A collective group restart (a resize, a lost member) stops the trainers and then asks
the master to restart at the checkpoint. If the stopping group acknowledged the job's
last task first, what it trained since the checkpoint is lost with it, so the data must
be read again from there: `reopen` does that. Without it a finished job is refused, and
it is refused with it too once a deployer recorded the job's end. The data's end is not
that record: it leaves etcd's `phase` key alone.
"""

from __future__ import annotations

import contextlib

import grpc
import pytest
from datasets import write_records
from masters import pb, read_to_the_end, stub, wait_serving
from test_master_bounds import refused
from waiting import wait_for

from paddlecloud import etcd
from paddlecloud.auth import ClientCredentials
from paddlecloud.backends.local.job import (
    OPERATOR_DEADLINE,
    POLL_DEADLINE,
    JobFailed,
    LocalJob,
    LocalJobSpec,
)
from paddlecloud.keys import JobKeys
from paddlecloud.master_client import MasterConnection, MasterLocator


async def phase_of(m) -> str:
    return (await m.GetStatus(pb.GetStatusRequest())).phase


async def wait_phase(m, phase: str) -> None:
    async def reached() -> bool:
        return await phase_of(m) == phase
    await wait_for(reached, timeout=30)


@pytest.fixture
def data(tmp_path):
    write_records(tmp_path / "data", files=4, records_per_file=2)
    return str(tmp_path / "data")


# The group restarts of these tests are `paddlecloud local train`'s: its masters run so.
DEPLOYED = ("--deployer", "local")


async def finished_job(data: str, start_master, *flags: str):
    """A master whose job's data is all consumed (one trainer read it to its end), and the
    task ids that trainer was dealt."""
    proc = start_master("--input", data, *(flags or DEPLOYED))
    await wait_serving(proc.address, process=proc)
    async with grpc.aio.insecure_channel(proc.address) as channel:
        m = stub(channel)
        dealt = await read_to_the_end(m)
        await wait_phase(m, "Succeeded")
    return proc, dealt


async def test_a_finished_job_is_refused_and_reopened_from_the_checkpoint_on_request(
        data, start_master, etcd_endpoint, job_name):
    proc, first = await finished_job(data, start_master)
    assert len(first) == 4
    async with grpc.aio.insecure_channel(proc.address) as channel:
        m = stub(channel)
        await refused(m.RestartEpoch(pb.RestartEpochRequest(epoch=0)), grpc.StatusCode.FAILED_PRECONDITION,
                      "finished (Succeeded: its data is all consumed)", "reopen")
        assert await phase_of(m) == "Succeeded"

        client = await etcd.connect(etcd_endpoint)
        try:  # the data's end is not a verdict: no deployer recorded one here
            assert await client.get(JobKeys("local", job_name).phase) is None
        finally:
            await client.close()

        checkpoint = first[:1]  # what the model had when the group last saved
        reply = await m.RestartEpoch(pb.RestartEpochRequest(epoch=0, done_tasks=checkpoint, reopen=True))
        assert reply.current_epoch == 0
        status = await m.GetStatus(pb.GetStatusRequest())
        assert (status.phase, status.counts.done, status.counts.todo) == ("Running", 1, 3)
        again = await read_to_the_end(m)
        assert sorted(again) == sorted(first[1:])  # every task but the checkpoint's, once
        await wait_phase(m, "Succeeded")


async def test_a_standalone_master_s_finished_job_is_never_reopened(data, start_master):
    """No deployer owns the job's end (--deployer none): Succeeded is final, whoever asks."""
    proc, _ = await finished_job(data, start_master, "--deployer", "none")
    async with grpc.aio.insecure_channel(proc.address) as channel:
        m = stub(channel)
        await refused(m.RestartEpoch(pb.RestartEpochRequest(epoch=0, reopen=True)),
                      grpc.StatusCode.FAILED_PRECONDITION, "no deployer (--deployer none)", "its end is final")
        assert await phase_of(m) == "Succeeded"


async def test_a_job_whose_end_is_recorded_is_not_reopened(data, start_master, etcd_endpoint, job_name):
    proc, _ = await finished_job(data, start_master)
    proc.stop()
    client = await etcd.connect(etcd_endpoint)
    keys = JobKeys("local", job_name)
    try:
        await client.put(keys.phase, b"Succeeded")  # as a deployer records its verdict
        later = start_master("--input", data, *DEPLOYED, name="later")  # a failover after the verdict
        await wait_serving(later.address, process=later)
        async with grpc.aio.insecure_channel(later.address) as channel:
            await refused(stub(channel).RestartEpoch(pb.RestartEpochRequest(epoch=0, reopen=True)),
                          grpc.StatusCode.FAILED_PRECONDITION, "end is recorded (Succeeded)")
        assert (await client.get(keys.phase)).value == b"Succeeded"  # not rewritten Running
    finally:
        await client.close()


async def test_an_older_masters_succeeded_at_the_data_s_end_is_not_taken_for_a_verdict(
        data, start_master, etcd_endpoint, job_name):
    """Older masters wrote `phase` Succeeded in the data's end's own transaction; a deployer's
    verdict is a write of its own. A new master tells them apart by their revisions."""
    proc, first = await finished_job(data, start_master)
    proc.stop()
    client = await etcd.connect(etcd_endpoint)
    keys = JobKeys("local", job_name)
    try:
        epoch = (await client.get(keys.epoch)).value
        await client.transaction(compare=[], success=[client.transactions.put(keys.epoch, epoch),
                                                      client.transactions.put(keys.phase, b"Succeeded")],
                                 failure=[])
        later = start_master("--input", data, *DEPLOYED, name="later")
        await wait_serving(later.address, process=later)
        async with grpc.aio.insecure_channel(later.address) as channel:
            m = stub(channel)
            reply = await m.RestartEpoch(pb.RestartEpochRequest(epoch=0, done_tasks=first[:1], reopen=True))
            assert reply.current_epoch == 0
            assert sorted(await read_to_the_end(m)) == sorted(first[1:])
    finally:
        await client.close()


async def failed_job(tmp_path, start_master):
    """A master whose job failed: its one task failed once, past --max-task-failures 0."""
    write_records(tmp_path / "data", files=1, records_per_file=1)
    proc = start_master("--input", str(tmp_path / "data"), "--max-task-failures", "0")
    await wait_serving(proc.address, process=proc)
    async with grpc.aio.insecure_channel(proc.address) as channel:
        m = stub(channel)
        session = (await m.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="t"))).session_id
        task = (await m.GetTask(pb.GetTaskRequest(session_id=session, epoch=0))).task
        await m.TaskFailed(pb.TaskReport(session_id=session, task_id=task.id, epoch=0,
                                         attempt=task.attempt, reason="bad record"))
        await wait_phase(m, "Failed")
    return proc


async def test_a_failed_job_is_not_reopened(tmp_path, start_master):
    proc = await failed_job(tmp_path, start_master)
    async with grpc.aio.insecure_channel(proc.address) as channel:
        await refused(stub(channel).RestartEpoch(pb.RestartEpochRequest(epoch=0, reopen=True)),
                      grpc.StatusCode.FAILED_PRECONDITION, "every task of epoch 0 failed")


class _Counting(grpc.aio.UnaryUnaryClientInterceptor):
    """Counts the RestartEpoch calls a channel sends."""

    def __init__(self) -> None:
        self.restarts = 0

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        if client_call_details.method.endswith(b"/RestartEpoch"):
            self.restarts += 1
        return await continuation(client_call_details, request)


@contextlib.asynccontextmanager
async def supervisor_of(tmp_path, job: str, address: str):
    """The local supervisor of `job`, its leader known to be `address` (its masters not
    started), and what counts its RestartEpoch calls."""
    spec = LocalJobSpec(job=job, module="trainer_agent.stub", output=tmp_path / "out",
                        inputs=(str(tmp_path / "data"),), restart_mode="group")
    supervisor = LocalJob(spec, on_line=lambda *_: None)
    supervisor.progress.leader = address
    counting = _Counting()
    for deadline in (POLL_DEADLINE, OPERATOR_DEADLINE):  # its clients of the leader, at `address`
        supervisor._masters[deadline] = MasterConnection(
            MasterLocator(master_endpoint=address), deadline=deadline, credentials=ClientCredentials(),
            open_channel=lambda where: grpc.aio.insecure_channel(where, interceptors=[counting]))
    try:
        yield supervisor, counting
    finally:
        for connection in supervisor._masters.values():
            await connection.close()


async def test_the_local_supervisor_s_group_restart_reopens_a_job_that_ended_meanwhile(
        tmp_path, data, start_master, job_name):
    proc, first = await finished_job(data, start_master)
    async with grpc.aio.insecure_channel(proc.address) as channel:
        m = stub(channel)
        async with supervisor_of(tmp_path, job_name, proc.address) as (supervisor, counting):
            await supervisor._restart_epoch(0, tuple(first[:2]))
        assert counting.restarts == 1
        assert "the master restarted epoch 0 with the checkpoint's 2 tasks done" in supervisor.progress.events
        status = await m.GetStatus(pb.GetStatusRequest())
        assert (status.phase, status.counts.done) == ("Running", 2)


async def test_the_local_supervisor_fails_at_once_on_an_answer_no_retry_changes(
        tmp_path, start_master, job_name):
    proc = await failed_job(tmp_path, start_master)
    async with supervisor_of(tmp_path, job_name, proc.address) as (supervisor, counting):
        with pytest.raises(JobFailed, match="could not restart epoch 0: .*every task of epoch 0 failed"):
            await supervisor._restart_epoch(0)
    assert counting.restarts == 1  # refused for good: not retried for a minute
