"""Work stealing against real master processes, a real etcd and real stub trainers
(docs/design.md section 5a): the split is agreed, durable across a failover, and fenced;
a job with one slowed trainer finishes with every record read exactly once."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import grpc
import pytest
from datasets import write_records
from masters import metric, pb, stub, wait_for, wait_serving
from trainers import read_log, reads_per_epoch

from paddlecloud.master_client.discovery import MasterLocator
from paddlecloud.wire import seconds
from trainer_agent.client import TaskClient
from trainer_agent.readers import read_chunk


def lines_of(chunks) -> list[str]:
    return [record for chunk in chunks for record in read_chunk(chunk, "lines")]


def page_json(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/job", timeout=10) as reply:
        return json.loads(reply.read())


def one_task_of_20_records(tmp_path):
    data = tmp_path / "data.csv"
    records = [f"record-{i:03d}" for i in range(20)]
    data.write_text("".join(f"{r}\n" for r in records))
    return data, records


async def split_after_five_records(master, records: list[str]) -> tuple[int, int, pb.Task, int]:
    """Trainer "slow" holds the job's one task; "idle" asks in vain, so the master asks "slow"
    (in its KeepAlive answer) to split; it agrees at its sixth record. (slow, idle, task, position)."""
    slow = (await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="slow"))).session_id
    idle = (await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="idle"))).session_id
    dealt = await master.GetTask(pb.GetTaskRequest(session_id=slow, epoch=0))
    held = dealt.task
    waiting = await master.GetTask(pb.GetTaskRequest(session_id=idle, epoch=0))
    assert waiting.outcome == pb.WAIT
    # nothing is left to deal: the holders of the epoch's tail are asked to call every second
    assert seconds(dealt.split_poll) == seconds(waiting.split_poll) == 1.0
    asked = (await master.KeepAlive(pb.KeepAliveRequest(session_id=slow))).split_requests
    assert [(r.task_id, r.attempt) for r in asked] == [(held.id, held.attempt)]
    position = sum(len(r) + 1 for r in records[:5])  # read 5 records: stop before the 6th
    split = pb.SplitTaskRequest(session_id=slow, task_id=held.id, epoch=0, attempt=held.attempt,
                                position=position)
    assert (await master.SplitTask(split)).answer == pb.STOP
    assert (await master.GetStatus(pb.GetStatusRequest())).splits_this_epoch == 1
    return slow, idle, held, position


async def listed(master) -> dict[int, tuple[int, list[str]]]:
    tasks = (await master.ListTasks(pb.ListTasksRequest())).tasks
    return {t.id: (t.state, lines_of(t.chunks)) for t in tasks}


async def test_a_split_is_agreed_survives_a_failover_and_fences_the_stragglers_reports(
        tmp_path, start_master):
    data, records = one_task_of_20_records(tmp_path)
    first = start_master("--input", str(data), metrics=True)
    await wait_serving(first.address, process=first)
    async with grpc.aio.insecure_channel(first.address) as channel:
        slow, idle, held, position = await split_after_five_records(stub(channel), records)
    # the status page's JSON and the metrics count it
    page = await asyncio.to_thread(page_json, first.metrics_port)
    assert (page["splits_this_epoch"], page["splits_total"]) == (1, 1)
    assert await asyncio.to_thread(metric, first.metrics_port, "paddlecloud_master_task_splits_total") == 1
    first.stop()

    second = start_master("--input", str(data), name="second")  # a new leader, from etcd alone
    await wait_serving(second.address, process=second)
    async with grpc.aio.insecure_channel(second.address) as channel:
        master = stub(channel)
        piece = (await master.GetTask(pb.GetTaskRequest(session_id=idle, epoch=0))).task
        assert piece.id == 1  # the job's one task is 0; the piece is the next id
        assert lines_of(piece.chunks) == records[5:]
        assert (await master.GetStatus(pb.GetStatusRequest())).splits_this_epoch == 1
        assert await listed(master) == {0: (pb.PENDING, records[:5]), 1: (pb.PENDING, records[5:])}
        # the straggler may not claim more than its part: the rest is the piece's
        past = pb.SplitTaskRequest(session_id=slow, task_id=held.id, epoch=0, attempt=held.attempt,
                                   position=position + 30)
        assert (await master.SplitTask(past)).answer == pb.STOP
        stale = pb.TaskReport(session_id=slow, task_id=piece.id, epoch=0, attempt=held.attempt)
        assert (await master.TaskFinished(stale)).result == pb.STALE
        theirs = pb.SplitTaskRequest(session_id=idle, task_id=held.id, epoch=0, attempt=held.attempt,
                                     position=0)
        assert (await master.SplitTask(theirs)).answer == pb.NOT_HELD
        status = await master.GetStatus(pb.GetStatusRequest())
        assert status.counts.done == 0 and status.counts.pending == 2
        for session, task in ((slow, held), (idle, piece)):
            report = pb.TaskReport(session_id=session, task_id=task.id, epoch=0, attempt=task.attempt)
            assert (await master.TaskFinished(report)).result == pb.ACCEPTED
        async def epoch_ended() -> bool:
            return (await master.GetStatus(pb.GetStatusRequest())).current_epoch == 1

        await wait_for(epoch_ended, timeout=60, message="the epoch did not end with both parts done")


async def test_a_job_with_a_slowed_trainer_reads_every_record_once_with_splits(
        tmp_path, start_master, start_trainer, etcd_endpoint, job_name):
    directory = tmp_path / "data"
    directory.mkdir()
    expected = set()
    for f in range(6):
        lines = [f"{f}-{i:03d}" for i in range(40)]
        expected.update(lines)
        (directory / f"part-{f}.csv").write_text("".join(f"{line}\n" for line in lines))
    proc = start_master("--input", str(directory / "*.csv"), "--epochs", "2", "--session-ttl", "3s",
                        metrics=True)
    await wait_serving(proc.address, process=proc)
    log = tmp_path / "records.tsv"
    trainers = [start_trainer(f"fast-{n}", log=log, master=proc.address, args=("--delay", "0.01"))
                for n in range(2)]
    trainers.append(start_trainer("slow", log=log, master=proc.address, args=("--delay", "0.1")))
    for trainer in trainers:
        assert trainer.wait(timeout=110) == 0, trainer.output_text()[-2000:]
    per_epoch = reads_per_epoch(read_log(log))
    assert sorted(per_epoch) == [0, 1]
    for epoch, counts in per_epoch.items():
        assert set(counts) == expected, epoch
        assert set(counts.values()) == {1}, (epoch, [r for r, n in counts.items() if n > 1][:5])
    async with grpc.aio.insecure_channel(proc.address) as channel:
        status = await stub(channel).GetStatus(pb.GetStatusRequest())
    assert status.splits >= 1
    pieces = {task for _, _, task, _ in read_log(log) if task >= 6}
    assert pieces, "no trainer read a piece split off a task"
    # the page tells the truth of a past epoch: its 6 tasks done, the pieces as parts of them
    page = await asyncio.to_thread(page_json, proc.metrics_port)
    assert [(e["stage"], e["done"], e["failed"]) for e in page["epochs"]] == [("past", 6, 0)] * 2


def test_a_local_job_with_a_straggler_splits_its_tasks_and_reads_each_record_once(tmp_path, local_run):
    """`paddlecloud local train` with three stub trainers, trainer 0 five times slower: its
    tasks' unread rests go to the others (pieces: task ids past the job's tasks), and every
    record is read exactly once in each epoch."""
    write_records(tmp_path / "data", files=6, records_per_file=60)
    run = local_run("--module", "trainer_agent.stub", "--input", str(tmp_path / "data"), "--trainers", "3",
                    "--epochs", "2", "--session-ttl", "3s", "-e", "PADDLECLOUD_STUB_SLOW_IDS=0",
                    "--", "--delay", "0.01", "--slowdown", "5")
    assert run.wait() == 0, run.text()
    rows = read_log(run.records)
    expected = {f"{f}-{i},{(f * 31 + i) % 97}" for f in range(6) for i in range(60)}
    for epoch, counts in reads_per_epoch(rows).items():
        assert set(counts) == expected, epoch
        assert set(counts.values()) == {1}, (epoch, [r for r, n in counts.items() if n > 1][:5])
    assert sorted(reads_per_epoch(rows)) == [0, 1]
    assert {task for _, _, task, _ in rows if task >= 6}, "no piece of a split task was read"


async def test_a_restart_of_the_epoch_keeps_its_cuts_so_a_checkpoint_may_name_a_piece(
        tmp_path, start_master):
    data, records = one_task_of_20_records(tmp_path)
    first = start_master("--input", str(data))
    await wait_serving(first.address, process=first)
    async with grpc.aio.insecure_channel(first.address) as channel:
        master = stub(channel)
        await split_after_five_records(master, records)
        restart = pb.RestartEpochRequest(epoch=0, done_tasks=[1])  # the model consumed the piece
        assert (await master.RestartEpoch(restart)).current_epoch == 0
        assert await listed(master) == {0: (pb.TODO, records[:5]), 1: (pb.DONE, records[5:])}
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await master.RestartEpoch(pb.RestartEpochRequest(epoch=0, done_tasks=[2]))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "done task 2 is outside 0..1" in refused.value.details()
    first.stop()
    second = start_master("--input", str(data), name="second")  # the cuts are etcd's
    await wait_serving(second.address, process=second)
    async with grpc.aio.insecure_channel(second.address) as channel:
        assert await listed(stub(channel)) == {0: (pb.TODO, records[:5]), 1: (pb.DONE, records[5:])}


async def test_a_trainer_holding_the_epochs_tail_keeps_alive_every_second(tmp_path, start_master):
    """With the default 30 s session, a reader calls every 10 s; once the master deals the
    last task it says `split_poll`, and the client keeps alive that often (so a split
    request reaches it within a second), until an answer says otherwise."""
    write_records(tmp_path / "data", files=2, records_per_file=5)
    proc = start_master("--input", str(tmp_path / "data" / "*.csv"))
    await wait_serving(proc.address, process=proc)

    def intervals_after_two_deals() -> list[float]:
        client = TaskClient(trainer_id="t", locator=MasterLocator(master_endpoint=proc.address))
        with client:
            intervals = []
            for _ in range(2):  # the first leaves a task to deal, the second none
                assert client.fetch(0).result(timeout=60).outcome == pb.TASK
                intervals.append(client.session.beat_interval)
            return intervals

    assert await asyncio.to_thread(intervals_after_two_deals) == [10.0, 1.0]
