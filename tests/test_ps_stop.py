"""A PS trainer's stop (trainer_agent.ps.PsStop) against a real master.

Trainer 0 saves only once every other trainer left the master, with the tasks the master
counts done in the epoch (read by each trainer, acknowledged); while another trainer is
alive past the grace, it saves nothing (the last checkpoint stands). Every trainer leaves.
"""

from __future__ import annotations

import time

import pytest
from datasets import write_records
from masters import pb
from test_trainer_client import client_for, serving, status, tasks

from trainer_agent import termination
from trainer_agent.checkpoint import TrainStatus
from trainer_agent.ps import PsStop


@pytest.fixture
def draining():
    """PsStop makes this process drain on SIGTERM: back to leaving at once afterwards."""
    yield
    termination.drain_on_stop(False)


def read_one_task(client) -> int:
    """Reads one whole task of the current epoch, as a drain ends it (between tasks); its id."""
    epoch = next(client.epochs())
    epoch.stop = lambda: True
    for _ in epoch.records():
        pass
    client.flush()
    assert len(epoch.finished) == 1, epoch.finished
    return epoch.finished[0]


def test_trainer_0_saves_the_masters_done_tasks_once_the_others_left(tmp_path, start_master, draining):
    write_records(tmp_path / "data", files=6, records_per_file=5)
    proc = serving(start_master("--input", str(tmp_path / "data"), "--chunk-bytes", "64",
                                "--session-ttl", "60s"))
    saved: list[TrainStatus] = []
    zero, one = client_for(proc, "0"), client_for(proc, "1")
    stop = PsStop(zero)
    read = {read_one_task(zero), read_one_task(one)}
    one.close()  # trainer 1 drained and left
    assert stop.stop(save=saved.append) == termination.STOPPED_EXIT
    done = {t.id for t in tasks(proc, pb.DONE)}
    assert done == read and saved == [TrainStatus(0, tasks_done=tuple(done))]
    assert status(proc).trainers_alive == 0  # trainer 0 left too


def test_trainer_0_saves_nothing_while_another_trainer_stays(tmp_path, start_master, draining,
                                                             monkeypatch):
    monkeypatch.setenv("PADDLECLOUD_STOP_GRACE", "1")
    write_records(tmp_path / "data", files=4, records_per_file=5)
    proc = serving(start_master("--input", str(tmp_path / "data"), "--chunk-bytes", "64",
                                "--session-ttl", "60s"))
    saved: list[TrainStatus] = []
    zero, stays = client_for(proc, "0"), client_for(proc, "1")
    try:
        stays.register()
        read_one_task(zero)
        started = time.monotonic()
        assert PsStop(zero).stop(save=saved.append) == termination.STOPPED_EXIT
        assert saved == [] and time.monotonic() - started < 30
        assert status(proc).trainers_alive == 1  # trainer 0 left; the other is still there
    finally:
        stays.close()


def test_a_resumed_checkpoints_tasks_are_acknowledged_unread(tmp_path, start_master, draining):
    write_records(tmp_path / "data", files=4, records_per_file=5)
    proc = serving(start_master("--input", str(tmp_path / "data"), "--chunk-bytes", "64",
                                "--epochs", "2"))
    kept = tuple(sorted(t.id for t in tasks(proc, pb.TODO))[:2])
    read: dict[int, dict[int, list[str]]] = {}  # epoch -> task -> its records read
    with client_for(proc, "0") as client:
        # a checkpoint saved inside epoch 1 with two of its tasks done
        stop = PsStop(client, resumed=TrainStatus(1, tasks_done=kept))
        for epoch in stop.epochs():
            for record in epoch.records():
                read.setdefault(epoch.number, {}).setdefault(epoch.current_task.id, []).append(record)
    assert status(proc).phase == "Succeeded"  # the kept tasks were acknowledged
    assert set(kept) <= set(read[0]) and not set(kept) & set(read[1])
    assert read[1] == {task: records for task, records in read[0].items() if task not in kept}
