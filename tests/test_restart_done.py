"""RestartEpoch with the tasks a checkpoint consumed: the epoch resumes with exactly those done."""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc
import pytest
from datasets import write_records
from etcd_history import check_exactly_once, mark_history
from masters import pb, wait_serving
from test_master_tasks import channel_to, register, report, run_trainer  # noqa: F401 (a fixture)
from test_state import Harness

from master.state import EpochRestarted, TaskStatus, task_order
from paddlecloud.keys import JobKeys


def test_a_restart_with_done_tasks_deals_only_the_others_in_the_epoch_order():
    h = Harness(num_tasks=6, num_epochs=3, seed=4)
    h.finish_epoch()
    a, _ = h.dispatch()
    h.finish(a)
    h.apply(EpochRestarted(0, (1, 4)))
    s = h.state
    assert s.epoch == 0
    assert s.counts[TaskStatus.DONE] == 2 and s.counts[TaskStatus.TODO] == 4
    assert list(s.todo) == [t for t in task_order(6, seed=4, epoch=0) if t not in (1, 4)]


@pytest.mark.parametrize("done", [(6,), (-1,), (2, 2)])
def test_a_restart_naming_a_task_outside_the_job_or_twice_is_refused(done):
    Harness(num_tasks=6, num_epochs=2).refused(EpochRestarted(0, done))


async def test_the_done_marks_are_written_with_the_restart_and_those_tasks_never_dealt(
        tmp_path, start_master, channel_to, etcd_endpoint, job_name):  # noqa: F811
    write_records(tmp_path / "data", files=6, records_per_file=1)
    proc = start_master("--input", str(tmp_path / "data"), "--epochs", "2")
    await wait_serving(proc.address, process=proc)
    master = await channel_to(proc.address)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await master.RestartEpoch(pb.RestartEpochRequest(epoch=0, done_tasks=[2, 9]))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "done task 9 is outside 0..5" in refused.value.details()

    # two tasks finished before the restart: one the checkpoint had consumed, one it had not
    session = await register(master, "early")
    finished = []
    for _ in range(2):
        task = (await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=0))).task
        assert (await master.TaskFinished(report(session, task))).result == pb.ACCEPTED
        finished.append(task.id)
    kept, dropped = finished
    other = next(t for t in range(6) if t not in finished)
    reply = await master.RestartEpoch(pb.RestartEpochRequest(epoch=0, done_tasks=[other, kept, other]))
    assert reply.current_epoch == 0
    status = await master.GetStatus(pb.GetStatusRequest())
    assert (status.counts.done, status.counts.todo) == (2, 4)
    accepted: Counter = Counter()
    await asyncio.wait_for(run_trainer(master, "t", accepted=accepted), 60)
    assert sorted(t for e, t in accepted if e == 0) == sorted(set(range(6)) - {kept, other})
    assert sorted(t for e, t in accepted if e == 1) == list(range(6))
    events = [(m.kind, m.epoch, m.task) for m in
              await mark_history(etcd_endpoint, JobKeys("local", job_name), "done")]
    check_exactly_once(events, num_tasks=6, num_epochs=2)
    # the kept mark was never written again nor cleared by the restart; the other one was cleared
    assert events.count(("PUT", 0, kept)) == 1 and events.count(("PUT", 0, dropped)) == 2
