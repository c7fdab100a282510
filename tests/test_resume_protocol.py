"""The checkpoint-boundary protocol against a real master, one trainer (no process group).

A segment ends between tasks (the drain), ``boundary()`` names exactly the tasks whose
records were all read, a restart with them resumes with only the others, and a task the
master deals again anyway is acknowledged unread. The collective case (all_gather over
trainers, resizes, SIGKILL) is tests/test_resume_paddle.py.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import Counter

import grpc
import numpy as np
import pytest
from datasets import write_records
from masters import pb, stub, wait_serving, wait_until

paddle = pytest.importorskip("paddle")

from paddlecloud.master_client.discovery import MasterLocator  # noqa: E402
from trainer_agent.checkpoint import CheckpointEvery, TrainStatus  # noqa: E402
from trainer_agent.client import TaskClient  # noqa: E402
from trainer_agent.paddle import MasterDataset, SessionLapsed  # noqa: E402

pytestmark = pytest.mark.paddle

FILES, PER_FILE = 6, 10  # one task per file


def parse(line: str) -> np.ndarray:
    """`<file>-<line>,...` -> [file, line]."""
    return np.array([int(v) for v in line.split(",")[0].split("-")], dtype=np.int64)


def master_for(start_master, tmp_path, *extra: str, epochs: int = 1):
    write_records(tmp_path / "data", files=FILES, records_per_file=PER_FILE)
    proc = start_master("--input", str(tmp_path / "data"), "--epochs", str(epochs), *extra)
    asyncio.run(wait_serving(proc.address, process=proc))
    return proc


def dataset_of(proc, every: CheckpointEvery | None, *, parse=parse) -> MasterDataset:
    factory = functools.partial(TaskClient, locator=MasterLocator(master_endpoint=proc.address),
                                deadline=60)
    return MasterDataset(parse=parse, client_factory=factory, trainer_id="t0", checkpoint_every=every)


def segment(dataset: MasterDataset) -> list[tuple[int, int]]:
    loader = paddle.io.DataLoader(dataset, batch_size=4, num_workers=0)
    return [tuple(int(v) for v in row) for batch in loader for row in batch.numpy()]


def whole_files(records: list[tuple[int, int]]) -> set[int]:
    """The files read; fails when one was read in part or a record twice."""
    counts = Counter(records)
    assert set(counts.values()) <= {1}, "a record read twice"
    per_file = Counter(f for f, _ in records)
    assert set(per_file.values()) <= {PER_FILE}, f"a task read in part: {per_file}"
    return set(per_file)


def test_checkpoint_every_takes_tasks_or_a_duration_and_names_a_bad_value(monkeypatch):
    assert CheckpointEvery.parse("20") == CheckpointEvery(tasks=20)
    assert CheckpointEvery.parse("2m") == CheckpointEvery(seconds=120.0)
    assert str(CheckpointEvery.parse("30s")) == "30s" and str(CheckpointEvery.parse("7")) == "7"
    assert CheckpointEvery(tasks=5).due(tasks=3, elapsed=0, trainers=2)       # ceil(5/2) = 3
    assert not CheckpointEvery(tasks=5).due(tasks=2, elapsed=99, trainers=2)
    assert CheckpointEvery(seconds=1.0).due(tasks=0, elapsed=1.0, trainers=1)
    for bad in ("0", "soon", "-3s"):
        with pytest.raises(ValueError, match=bad[:2]):
            CheckpointEvery.parse(bad)
    monkeypatch.setenv("PADDLECLOUD_CHECKPOINT_EVERY", "4")
    assert CheckpointEvery.from_env() == CheckpointEvery(tasks=4)
    monkeypatch.setenv("PADDLECLOUD_CHECKPOINT_EVERY", "")
    assert CheckpointEvery.from_env() is None


@pytest.mark.timeout(120)
def test_segments_end_between_tasks_and_boundaries_name_exactly_the_tasks_read(tmp_path, start_master):
    proc = master_for(start_master, tmp_path)
    read: list[tuple[int, int]] = []
    boundaries = []
    with dataset_of(proc, CheckpointEvery(tasks=2)) as dataset:
        while True:
            read += segment(dataset)
            boundary = dataset.boundary()
            boundaries.append(boundary)
            files = whole_files(read)
            if boundary.epoch_over:
                break
            # exactly the tasks read, all of them whole, and nothing of another task
            assert len(boundary.tasks_done) == len(files) == 2 * len(boundaries)
            assert boundary.train_status == TrainStatus(0, tasks_done=boundary.tasks_done)
        # the drain gave back only tasks it had not read: every ack was taken (the master
        # re-sends the task read last when nothing is left, and returning that one made its
        # ack stale and the task dealt again)
        assert dataset.client.stats["stale"] == 0
    assert whole_files(read) == set(range(FILES))
    # a drain after tasks 2, 4 and 6, then an empty segment that hears of the epoch's end
    assert [b.epoch_over for b in boundaries] == [False] * (FILES // 2) + [True]
    assert [b.epoch for b in boundaries] == [0] * len(boundaries)
    assert boundaries[-1].job_done and boundaries[-1].train_status == TrainStatus(0)
    with grpc.insecure_channel(proc.address) as channel:
        assert stub(channel).GetStatus(pb.GetStatusRequest()).phase == "Succeeded"


@pytest.mark.timeout(120)
def test_a_restart_with_the_boundary_s_tasks_reads_exactly_the_others(tmp_path, start_master):
    # two epochs: reading past the checkpoint ends epoch 0, and a finished job is not restarted
    proc = master_for(start_master, tmp_path, epochs=2)
    with dataset_of(proc, CheckpointEvery(tasks=3)) as dataset:
        before = segment(dataset)
        boundary = dataset.boundary()
        read = segment(dataset)  # read on, past the checkpoint: a restart undoes this
    assert not boundary.epoch_over and len(boundary.tasks_done) == 3 and read
    with grpc.insecure_channel(proc.address) as channel:
        stub(channel).RestartEpoch(pb.RestartEpochRequest(epoch=0, done_tasks=boundary.tasks_done))
    after: list[tuple[int, int]] = []
    with dataset_of(proc, CheckpointEvery(tasks=3)) as dataset:
        dataset.resume(boundary.train_status)
        while True:
            after += segment(dataset)
            last = dataset.boundary()
            if last.epoch_over:
                break
            assert set(boundary.tasks_done) <= set(last.tasks_done)  # carried across the restart
    assert whole_files(before + after) == set(range(FILES))  # each record once, across it


@pytest.mark.timeout(120)
def test_a_consumed_task_dealt_again_is_acknowledged_unread(tmp_path, start_master):
    proc = master_for(start_master, tmp_path)
    with dataset_of(proc, CheckpointEvery(tasks=2)) as dataset:
        first = segment(dataset)
        boundary = dataset.boundary()
    with grpc.insecure_channel(proc.address) as channel:  # the master forgets what was done
        stub(channel).RestartEpoch(pb.RestartEpochRequest(epoch=0))
    with dataset_of(proc, None) as dataset:
        dataset.resume(boundary.train_status)
        rest = segment(dataset)
        assert dataset.boundary().epoch_over
    assert whole_files(first + rest) == set(range(FILES))


def trainers_alive(proc) -> int:
    with grpc.insecure_channel(proc.address) as channel:
        return stub(channel).GetStatus(pb.GetStatusRequest()).trainers_alive


@pytest.mark.timeout(120)
def test_a_session_that_lapsed_while_reading_fails_the_boundary(tmp_path, start_master):
    # The trainer goes silent mid-task (as one SIGSTOPped past its lease): the master deals
    # its tasks again, so what it read may be read again; nothing of the segment may be saved.
    proc = master_for(start_master, tmp_path, "--session-ttl", "2s")
    lapsed = threading.Event()

    def parse_after_the_lapse(line: str) -> np.ndarray:
        row = parse(line)
        if row[1] >= 5:  # the second half of every task is read once the session lapsed
            assert lapsed.wait(60)
        return row

    with dataset_of(proc, CheckpointEvery(tasks=2), parse=parse_after_the_lapse) as dataset:
        batches = iter(paddle.io.DataLoader(dataset, batch_size=4, num_workers=0))
        next(batches)  # inside the first task
        dataset.client.session.close()  # no more keep-alives
        wait_until(lambda: trainers_alive(proc) == 0, timeout=60, message="the session never expired")
        lapsed.set()
        assert len(list(batches)) == 4  # the rest of the segment (2 tasks), read on after the lapse
        with pytest.raises(SessionLapsed, match="expired while reading"):
            dataset.boundary()
