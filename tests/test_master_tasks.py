"""The master's task dispatch against a real etcd and real master processes."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter

import grpc
import pytest
from datasets import write_records
from etcd_history import done_marks, per_epoch
from masters import pb, stub, wait_for, wait_serving

from paddlecloud.keys import JobKeys
from paddlecloud.wire import duration, seconds


def ref(task: pb.Task) -> pb.TaskRef:
    return pb.TaskRef(task_id=task.id, epoch=task.epoch, attempt=task.attempt)


def report(session: int, task: pb.Task, reason: str = "") -> pb.TaskReport:
    return pb.TaskReport(session_id=session, task_id=task.id, epoch=task.epoch,
                         attempt=task.attempt, reason=reason)


async def register(master, trainer_id: str) -> int:
    reply = await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id=trainer_id))
    return reply.session_id


async def tasks_in_state(master, state) -> list[pb.TaskInfo]:
    reply = await master.ListTasks(pb.ListTasksRequest(state=state, page_size=1000))
    return list(reply.tasks)


@pytest.fixture
async def channel_to():
    channels = []

    async def open_channel(address: str):
        channel = grpc.aio.insecure_channel(address)
        channels.append(channel)
        return stub(channel)

    yield open_channel
    for channel in channels:
        await channel.close()


async def test_twenty_tasks_over_ten_epochs_each_handed_out_once_per_epoch(
        tmp_path, start_master, channel_to, etcd_endpoint, job_name):
    write_records(tmp_path / "data", files=20, records_per_file=3)
    proc = start_master("--input", str(tmp_path / "data" / "*.csv"), "--epochs", "10",
                        "--max-tasks-per-trainer", "100")
    await wait_serving(proc.address, process=proc)
    master = await channel_to(proc.address)
    hoarder = await register(master, "hoarder")
    latecomer = await register(master, "latecomer")
    for epoch in range(10):
        handed = []
        for _ in range(20):
            reply = await master.GetTask(pb.GetTaskRequest(session_id=hoarder, epoch=epoch))
            assert reply.outcome == pb.TASK
            handed.append(reply.task)
        assert sorted(t.id for t in handed) == list(range(20))
        # A 21st request, from a trainer holding nothing, waits: everything is pending.
        reply = await master.GetTask(pb.GetTaskRequest(session_id=latecomer, epoch=epoch))
        assert reply.outcome == pb.WAIT and seconds(reply.retry_after) >= 0.001
        results = await asyncio.gather(*(master.TaskFinished(report(hoarder, t)) for t in handed))
        assert all(r.result == pb.ACCEPTED for r in results)
        # A finished task reported failed afterwards stays done: the report is STALE.
        late = await master.TaskFailed(report(hoarder, handed[0], "too late"))
        assert late.result == pb.STALE

        async def epoch_moved(epoch=epoch):
            status = await master.GetStatus(pb.GetStatusRequest())
            return status.current_epoch == epoch + 1
        await wait_for(epoch_moved, message=f"epoch {epoch} did not end")
    reply = await master.GetTask(pb.GetTaskRequest(session_id=hoarder, epoch=10))
    assert reply.outcome == pb.JOB_DONE
    counted = per_epoch(await done_marks(etcd_endpoint, JobKeys("local", job_name)))
    assert sorted(counted) == list(range(10))
    assert all(c == Counter({t: 1 for t in range(20)}) for c in counted.values())


async def run_trainer(master, trainer_id: str, *, accepted: Counter) -> None:
    """A trainer that loops GetTask with the previous task piggybacked, until JOB_DONE."""
    session = await register(master, trainer_id)
    epoch, previous = 0, []
    while True:
        reply = await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=epoch, finished=previous))
        for ref_, result in zip(previous, reply.finished_results, strict=True):
            if result == pb.ACCEPTED:
                accepted[(ref_.epoch, ref_.task_id)] += 1
        previous = []
        if reply.outcome == pb.TASK:
            previous = [ref(reply.task)]
        elif reply.outcome == pb.EPOCH_DONE:
            epoch = reply.current_epoch
        elif reply.outcome == pb.WAIT:
            await asyncio.sleep(seconds(reply.retry_after) / 5)
        else:
            assert reply.outcome == pb.JOB_DONE
            return


async def test_four_concurrent_trainers_count_every_task_once_per_epoch(
        tmp_path, start_master, channel_to, etcd_endpoint, job_name):
    write_records(tmp_path / "data", files=50, records_per_file=1)
    proc = start_master("--input", str(tmp_path / "data"), "--epochs", "10")
    await wait_serving(proc.address, process=proc)
    master = await channel_to(proc.address)
    accepted: Counter = Counter()
    await asyncio.wait_for(
        asyncio.gather(*(run_trainer(master, f"t{i}", accepted=accepted) for i in range(4))), 120)
    assert accepted == Counter({(e, t): 1 for e in range(10) for t in range(50)})
    counted = per_epoch(await done_marks(etcd_endpoint, JobKeys("local", job_name)))
    assert {e: sum(c.values()) for e, c in counted.items()} == {e: 50 for e in range(10)}
    assert all(max(c.values()) == 1 for c in counted.values())
    status = await master.GetStatus(pb.GetStatusRequest())
    assert status.phase == "Succeeded" and status.current_epoch == 10


async def test_silent_trainer_loses_its_tasks_by_lease_not_by_timeout(
        tmp_path, start_master, channel_to):
    write_records(tmp_path / "data", files=4, records_per_file=2)
    proc = start_master("--input", str(tmp_path / "data"), "--session-ttl", "2s",
                        "--task-timeout", "1h")
    await wait_serving(proc.address, process=proc)
    master = await channel_to(proc.address)
    silent = await register(master, "silent")
    held = [(await master.GetTask(pb.GetTaskRequest(session_id=silent, epoch=0))).task for _ in range(2)]
    assert len({t.id for t in held}) == 2
    # The silent trainer never calls again; its lease lapses and its tasks come back.
    worker = await register(master, "worker")

    async def all_back():
        await master.KeepAlive(pb.KeepAliveRequest(session_id=worker))
        todo = await tasks_in_state(master, pb.TODO)
        return {t.id for t in held} <= {t.id for t in todo}
    await wait_for(all_back, timeout=30, message="the silent trainer's tasks did not return")
    finished = set()
    while len(finished) < 4:
        reply = await master.GetTask(pb.GetTaskRequest(session_id=worker, epoch=0))
        assert reply.outcome == pb.TASK
        assert (await master.TaskFinished(report(worker, reply.task))).result == pb.ACCEPTED
        finished.add(reply.task.id)
    # Its late finish is STALE, and no failure was counted for its tasks.
    assert (await master.TaskFinished(report(silent, held[0]))).result == pb.STALE
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await master.GetTask(pb.GetTaskRequest(session_id=silent, epoch=0))
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert "register again" in error.value.details()
    status = await master.GetStatus(pb.GetStatusRequest())
    assert status.phase == "Succeeded" and status.counts.failed == 0


async def test_leave_and_return_put_tasks_back_at_once(tmp_path, start_master, channel_to):
    write_records(tmp_path / "data", files=4, records_per_file=2)
    proc = start_master("--input", str(tmp_path / "data"))
    await wait_serving(proc.address, process=proc)
    master = await channel_to(proc.address)
    a = await register(master, "a")
    first = (await master.GetTask(pb.GetTaskRequest(session_id=a, epoch=0))).task
    second = (await master.GetTask(pb.GetTaskRequest(session_id=a, epoch=0))).task
    assert (await master.ReturnTask(report(a, first))).result == pb.ACCEPTED
    assert first.id in {t.id for t in await tasks_in_state(master, pb.TODO)}
    assert (await master.ReturnTask(report(a, first))).result == pb.STALE
    await master.LeaveTrainer(pb.LeaveTrainerRequest(session_id=a))
    todo = await tasks_in_state(master, pb.TODO)
    assert {first.id, second.id} <= {t.id for t in todo}
    assert all(t.failures == 0 for t in todo)
    # Returned tasks go out first again, each with a new attempt that fences the old copy.
    b = await register(master, "b")
    again = [(await master.GetTask(pb.GetTaskRequest(session_id=b, epoch=0))).task for _ in range(2)]
    assert {t.id for t in again} == {first.id, second.id}
    assert all(t.attempt > max(first.attempt, second.attempt) for t in again)


async def test_reregistering_supersedes_the_old_session(tmp_path, start_master, channel_to):
    write_records(tmp_path / "data", files=3, records_per_file=2)
    proc = start_master("--input", str(tmp_path / "data"))
    await wait_serving(proc.address, process=proc)
    master = await channel_to(proc.address)
    old = await register(master, "trainer-7")
    held = (await master.GetTask(pb.GetTaskRequest(session_id=old, epoch=0))).task
    new = await register(master, "trainer-7")
    assert new != old
    assert held.id in {t.id for t in await tasks_in_state(master, pb.TODO)}
    for call in (master.GetTask(pb.GetTaskRequest(session_id=old, epoch=0)),
                 master.KeepAlive(pb.KeepAliveRequest(session_id=old))):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await call
        assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "superseded by a newer session of trainer trainer-7" in error.value.details()
    assert (await master.TaskFinished(report(old, held))).result == pb.STALE
    reply = await master.GetTask(pb.GetTaskRequest(session_id=new, epoch=0))
    assert reply.outcome == pb.TASK


async def test_poisoned_task_fails_after_max_failures_and_the_epoch_still_ends(
        tmp_path, start_master, channel_to):
    write_records(tmp_path / "data", files=3, records_per_file=2)
    proc = start_master("--input", str(tmp_path / "data"), "--epochs", "2", "--max-task-failures", "2")
    await wait_serving(proc.address, process=proc)
    master = await channel_to(proc.address)
    session = await register(master, "t")
    poisoned = None
    failures_seen = 0
    for epoch in range(2):
        failures_seen = 0
        while True:
            reply = await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=epoch))
            if reply.outcome == pb.EPOCH_DONE or reply.outcome == pb.JOB_DONE:
                break
            if reply.outcome == pb.WAIT:
                await asyncio.sleep(0.05)
                continue
            task = reply.task
            poisoned = task.id if poisoned is None else poisoned
            if task.id == poisoned:
                failures_seen += 1
                assert (await master.TaskFailed(report(session, task, "bad record"))).result == pb.ACCEPTED
            else:
                assert (await master.TaskFinished(report(session, task))).result == pb.ACCEPTED
        # Offered max_failures + 1 times, then failed for the rest of the epoch.
        assert failures_seen == 3
    status = await master.GetStatus(pb.GetStatusRequest())
    assert status.phase == "Succeeded"


async def test_all_tasks_failing_fails_the_job(tmp_path, start_master, channel_to):
    write_records(tmp_path / "data", files=2, records_per_file=1)
    proc = start_master("--input", str(tmp_path / "data"), "--max-task-failures", "0")
    await wait_serving(proc.address, process=proc)
    master = await channel_to(proc.address)
    session = await register(master, "t")
    for _ in range(2):
        reply = await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=0))
        assert reply.outcome == pb.TASK
        await master.TaskFailed(report(session, reply.task, "corrupt"))

    async def job_failed():
        reply = await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=0))
        return reply.outcome == pb.ALL_TASKS_FAILED
    await wait_for(job_failed, message="ALL_TASKS_FAILED never answered")
    assert (await master.GetStatus(pb.GetStatusRequest())).phase == "Failed"


async def test_duplicate_concurrent_finishes_count_once(tmp_path, start_master, channel_to):
    write_records(tmp_path / "data", files=2, records_per_file=1)
    proc = start_master("--input", str(tmp_path / "data"))
    await wait_serving(proc.address, process=proc)
    master = await channel_to(proc.address)
    session = await register(master, "t")
    task = (await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=0))).task
    replies = await asyncio.gather(*(master.TaskFinished(report(session, task)) for _ in range(10)))
    assert Counter(r.result for r in replies) == Counter({pb.ACCEPTED: 1, pb.STALE: 9})


async def test_master_killed_mid_epoch_loses_no_done_mark_and_counts_none_twice(
        tmp_path, start_master, channel_to, etcd_endpoint, job_name):
    write_records(tmp_path / "data", files=30, records_per_file=1)
    # A long session TTL: the trainer's lease must outlive a restart however slow the machine.
    args = ("--input", str(tmp_path / "data"), "--epochs", "2", "--session-ttl", "60s")
    first = start_master(*args)
    await wait_serving(first.address, process=first)
    master = await channel_to(first.address)
    session = await register(master, "t")
    finished = []
    for _ in range(10):
        task = (await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=0))).task
        assert (await master.TaskFinished(report(session, task))).result == pb.ACCEPTED
        finished.append(task.id)
    held = (await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=0))).task
    first.kill()
    second = start_master(*args, port=first.port)
    await wait_serving(second.address, process=second)
    done = await tasks_in_state(master, pb.DONE)
    assert {t.id for t in done} == set(finished)
    pending = await tasks_in_state(master, pb.PENDING)
    assert [(t.id, t.attempt, t.holder) for t in pending] == [(held.id, held.attempt, "t")]
    # The trainer carries on with its session: its held task finishes, the rest follows.
    assert (await master.TaskFinished(report(session, held))).result == pb.ACCEPTED
    accepted: Counter = Counter()
    await asyncio.wait_for(run_trainer(master, "t2", accepted=accepted), 60)
    counted = per_epoch(await done_marks(etcd_endpoint, JobKeys("local", job_name)))
    assert {e: sum(c.values()) for e, c in counted.items()} == {0: 30, 1: 30}
    assert all(max(c.values()) == 1 for c in counted.values())


async def test_get_task_before_the_dataset_is_known_waits(start_master, channel_to):
    proc = start_master()
    await wait_serving(proc.address, process=proc)
    master = await channel_to(proc.address)
    session = await register(master, "early")
    reply = await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=0))
    assert reply.outcome == pb.WAIT and seconds(reply.retry_after) >= 0.001
    status = await master.GetStatus(pb.GetStatusRequest())
    assert status.phase == "Pending" and not status.has_dataset


async def test_set_dataset_then_same_is_ok_and_different_is_refused(tmp_path, start_master, channel_to):
    write_records(tmp_path / "data", files=3, records_per_file=4)
    proc = start_master("--allow-set-dataset", str(tmp_path / "data"))
    await wait_serving(proc.address, process=proc)
    master = await channel_to(proc.address)
    spec = pb.DatasetSpec(paths=[str(tmp_path / "data" / "*.csv")], num_epochs=2)
    assert (await master.SetDataset(pb.SetDatasetRequest(dataset=spec))).num_tasks == 3
    # The same spec with its defaults spelled out is the same spec.
    spelled = pb.DatasetSpec(paths=spec.paths, num_epochs=2, format="lines",
                             chunk_bytes=64 * 1024 * 1024, chunks_per_task=1)
    assert (await master.SetDataset(pb.SetDatasetRequest(dataset=spelled))).num_tasks == 3
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await master.SetDataset(pb.SetDatasetRequest(dataset=pb.DatasetSpec(paths=spec.paths, num_epochs=3)))
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_master_restart_keeps_the_frozen_file_list(tmp_path, start_master, channel_to):
    paths = write_records(tmp_path / "data", files=3, records_per_file=2)
    args = ("--input", str(tmp_path / "data" / "*.csv"))
    first = start_master(*args)
    await wait_serving(first.address, process=first)
    first.stop()
    paths[0].unlink()  # a fresh glob would now see 2 files
    second = start_master(*args, port=first.port)
    await wait_serving(second.address, process=second)
    master = await channel_to(second.address)
    status = await master.GetStatus(pb.GetStatusRequest())
    assert status.num_tasks == 3


async def test_restart_epoch_clears_its_marks(tmp_path, start_master, channel_to):
    write_records(tmp_path / "data", files=3, records_per_file=1)
    proc = start_master("--input", str(tmp_path / "data"), "--epochs", "3")
    await wait_serving(proc.address, process=proc)
    master = await channel_to(proc.address)
    accepted: Counter = Counter()
    session = await register(master, "t")
    for _ in range(3):
        task = (await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=0))).task
        await master.TaskFinished(report(session, task))

    async def at_epoch_one():
        return (await master.GetStatus(pb.GetStatusRequest())).current_epoch == 1
    await wait_for(at_epoch_one)
    held = (await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=1))).task
    assert (await master.RestartEpoch(pb.RestartEpochRequest(epoch=0))).current_epoch == 0
    status = await master.GetStatus(pb.GetStatusRequest())
    assert (status.current_epoch, status.counts.todo, status.counts.done) == (0, 3, 0)
    assert (await master.TaskFinished(report(session, held))).result == pb.STALE
    await asyncio.wait_for(run_trainer(master, "t2", accepted=accepted), 60)
    assert sorted(accepted) == [(e, t) for e in range(3) for t in range(3)]


async def test_a_group_restart_takes_the_save_model_grant_from_the_old_group(tmp_path, start_master,
                                                                          channel_to):
    """A trainer stopped for a group restart may never leave (SIGKILL, a lost pod): its grant
    must not keep the restarted group from saving until its session expires."""
    write_records(tmp_path / "data", files=2, records_per_file=1)
    proc = start_master("--input", str(tmp_path / "data"))
    await wait_serving(proc.address, process=proc)
    master = await channel_to(proc.address)
    old, new = await register(master, "1"), await register(master, "0")
    block = duration(30)
    assert (await master.RequestSaveModel(pb.RequestSaveModelRequest(session_id=old, block=block))).granted
    assert not (await master.RequestSaveModel(pb.RequestSaveModelRequest(session_id=new, block=block))).granted
    await master.RestartEpoch(pb.RestartEpochRequest(epoch=0))
    assert (await master.RequestSaveModel(pb.RequestSaveModelRequest(session_id=new, block=block))).granted


async def test_sigterm_hands_leadership_over_cleanly(tmp_path, start_master, channel_to, etcd_endpoint, job_name):
    proc = start_master()
    await wait_serving(proc.address, process=proc)
    proc.signal(signal.SIGTERM)
    assert proc.process.wait(timeout=30) == 0
    from paddlecloud import etcd
    client = await etcd.connect(etcd_endpoint)
    try:
        assert await client.get(JobKeys("local", job_name).leader) is None
    finally:
        await client.close()


async def test_resume_from_a_checkpoint_starts_at_its_next_epoch(tmp_path, start_master, channel_to):
    from trainer_agent.checkpoint import TrainStatus, save_checkpoint

    write_records(tmp_path / "data", files=2, records_per_file=1)
    save_checkpoint(str(tmp_path / "ckpt"), {"w": 1}, TrainStatus(1))
    proc = start_master("--input", str(tmp_path / "data"), "--epochs", "4",
                        "--resume-from", str(tmp_path / "ckpt"))
    await wait_serving(proc.address, process=proc)
    master = await channel_to(proc.address)
    assert (await master.GetStatus(pb.GetStatusRequest())).current_epoch == 2
    session = await register(master, "late")
    reply = await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=0))
    assert reply.outcome == pb.EPOCH_DONE and reply.current_epoch == 2


async def test_status_says_whether_a_trainer_ever_took_a_task(tmp_path, start_master, channel_to):
    """`tasks_assigned` (docs/design.md section 12): False while no trainer took a task (a job
    that brings its own data ends by its trainers' exits), True from the first task on, and
    still True once that task went back and after a restart rebuilt the state from etcd."""
    write_records(tmp_path / "data", files=2, records_per_file=3)
    proc = start_master("--input", str(tmp_path / "data" / "*.csv"))
    await wait_serving(proc.address, process=proc)
    master = await channel_to(proc.address)
    session = await register(master, "t")
    assert not (await master.GetStatus(pb.GetStatusRequest())).tasks_assigned
    task = (await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=0))).task
    assert (await master.GetStatus(pb.GetStatusRequest())).tasks_assigned
    assert (await master.TaskFinished(report(session, task))).result == pb.ACCEPTED
    proc.stop()
    second = start_master("--input", str(tmp_path / "data" / "*.csv"), port=proc.port)
    await wait_serving(second.address, process=second)
    again = await channel_to(second.address)
    assert (await again.GetStatus(pb.GetStatusRequest())).tasks_assigned  # its done mark shows it
