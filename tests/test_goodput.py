"""Goodput: the job's trainer-seconds, productive or lost by cause (master.goodput).

The meter is pure: the first tests drive it with observations and a clock of their own. The
last ones run a real master: a job of two trainer slots with one hand-driven trainer, its
figures in GetStatus and /metrics adding up to two slots times the wall time, and a second
master that goes on from the first's figures after a SIGKILL, the gap counted as failover.
"""

from __future__ import annotations

import itertools
import json
import time

import grpc
import pytest
from datasets import write_records
from masters import metric, wait_serving
from waiting import wait_for

from master.goodput import (
    CAUSES,
    HISTORY_POINTS,
    LOST_CAUSES,
    GoodputMeter,
    Observation,
    holding_by_trainer,
)
from paddlecloud import etcd
from paddlecloud.api import pb, pb_grpc
from paddlecloud.keys import JobKeys


def obs(**kw) -> Observation:
    base = dict(capacity=2, running=True, has_dataset=True, epoch=0, todo=5, pending=1, num_tasks=8)
    return Observation(**{**base, **kw})


def drive(meter: GoodputMeter, steps: list[tuple[float, Observation]]) -> None:
    for now, o in steps:
        meter.sample(o, now=now)


@pytest.mark.unit
def test_the_causes_add_up_to_the_slots_times_the_wall_time():
    meter = GoodputMeter(now=0.0)
    drive(meter, [
        (1.0, obs(has_dataset=False, holding={"0": ()})),              # no dataset yet
        (2.0, obs(holding={"0": ()})),                                 # registered, no task yet
        (5.0, obs(holding={"0": (3,)})),                               # reading task 3
        (6.0, obs(holding={"0": ()}, saving=True)),                    # a checkpoint is saved
        (7.0, obs(holding={"0": ()}, todo=0, pending=1)),              # behind a straggler
        (8.0, obs(holding={"0": ()}, todo=4)),                         # not asking while tasks are free
        (9.0, obs(holding={})),                                        # the trainer died
    ])
    figures = meter.figures()
    assert set(figures) == set(CAUSES)
    assert figures["productive"] == 3.0
    assert figures["data_wait"] == 1.0 and figures["starting"] == 1.0
    assert figures["checkpoint"] == 1.0 and figures["straggler"] == 1.0 and figures["idle"] == 1.0
    assert figures["startup"] == 9.0  # slot 1 never had a trainer
    assert figures["restart"] == 1.0  # slot 0 had one, and lost it
    assert meter.productive + meter.lost == 2 * 9.0


@pytest.mark.unit
def test_a_finished_job_counts_no_more_seconds():
    meter = GoodputMeter(now=0.0)
    drive(meter, [(1.0, obs(holding={"0": (1,), "1": (2,)})), (5.0, obs(running=False, holding={}))])
    assert meter.productive + meter.lost == 2.0


@pytest.mark.unit
def test_loader_workers_count_as_their_trainer():
    holding = holding_by_trainer([("0/0", 11), ("0/1", 12), ("1", 13)], {11: (4,), 13: ()})
    assert holding == {"0": (4,), "1": ()}
    meter = GoodputMeter(now=0.0)
    meter.sample(obs(holding=holding), now=1.0)
    assert meter.figures()["productive"] == 1.0 and meter.figures()["starting"] == 1.0


@pytest.mark.unit
def test_work_a_restart_undid_becomes_recomputed():
    meter = GoodputMeter(now=0.0)
    drive(meter, [
        (4.0, obs(capacity=1, holding={"0": (1,)})),
        (6.0, obs(capacity=1, holding={"0": (2,)}, done=frozenset({1}))),
        # RestartEpoch at a checkpoint that had consumed neither: task 1's 4 s are undone
        (7.0, obs(capacity=1, holding={}, done=frozenset())),
    ])
    figures = meter.figures()
    assert figures["recomputed"] == 4.0
    assert figures["productive"] == 2.0
    assert meter.productive + meter.lost == 7.0


@pytest.mark.unit
def test_a_restart_at_an_earlier_epoch_undoes_the_later_epochs():
    meter = GoodputMeter(now=0.0)
    drive(meter, [
        (10.0, obs(capacity=1, epoch=0, holding={"0": (1,)})),
        (20.0, obs(capacity=1, epoch=1, holding={"0": (1,)})),
        (21.0, obs(capacity=1, epoch=0, holding={}, done_count=4, num_tasks=8)),  # back to epoch 0, half kept
    ])
    figures = meter.figures()
    assert figures["recomputed"] == pytest.approx(10.0 + 5.0)
    assert figures["productive"] == pytest.approx(5.0)


@pytest.mark.unit
def test_a_next_leader_goes_on_and_counts_the_gap_as_failover():
    meter = GoodputMeter(now=0.0)
    meter.sample(obs(holding={"0": (1,), "1": (2,)}), now=3.0)
    saved = meter.to_json(wall=1000.0)
    after = GoodputMeter.from_json(saved, now=50.0, wall=1004.0)
    assert after.figures()["productive"] == 6.0
    assert after.figures()["failover"] == 2 * 4.0
    assert after.ever == {"0", "1"} and after.started == {"0", "1"}
    assert GoodputMeter.from_json(None, now=0.0, wall=0.0).figures() == {c: 0.0 for c in CAUSES}
    assert json.loads(saved)["capacity"] == 2


@pytest.mark.unit
def test_the_history_spans_the_whole_life_thinned_and_a_next_leader_keeps_it():
    meter = GoodputMeter(now=0.0)
    for second in range(1, 3 * HISTORY_POINTS):
        meter.sample(obs(holding={"0": (1,)}), now=float(second))
        meter.mark(wall=1000.0 + second)
    points = meter.history_figures()
    assert len(points) <= HISTORY_POINTS
    assert points[0][0] == 1001.0 and points[0][1]["productive"] == 1.0  # the first point stays
    assert points[-1][0] == 1000.0 + 3 * HISTORY_POINTS - 1                       # and the newest
    walls = [wall for wall, _ in points]
    assert walls == sorted(walls)
    assert all(b["productive"] >= a["productive"] for (_, a), (_, b) in itertools.pairwise(points))
    after = GoodputMeter.from_json(meter.to_json(wall=5000.0), now=0.0, wall=5000.0)
    assert after.history_figures() == points


def trainer_seconds(reply: pb.GetStatusResponse) -> dict[str, float]:
    return {entry.cause: entry.seconds for entry in reply.trainer_seconds}


@pytest.mark.timeout(180)
async def test_a_master_accounts_its_slots_and_a_new_leader_goes_on(tmp_path, start_master):
    write_records(tmp_path / "data", files=4, records_per_file=5)
    args = ("--input", str(tmp_path / "data"), "--trainers", "2", "--session-ttl", "60s",
            "--election-ttl", "2s")
    started = time.monotonic()  # the master counts from its lead: after this, before serving
    first = start_master(*args, metrics=True)
    await wait_serving(first.address, process=first)
    serving = time.monotonic()
    async with grpc.aio.insecure_channel(first.address) as channel:
        master = pb_grpc.MasterStub(channel)
        registered = await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="0"))
        reply = await master.GetTask(pb.GetTaskRequest(session_id=registered.session_id, epoch=0))
        assert reply.outcome == pb.TASK  # trainer 0 holds a task; slot 1 never gets a trainer

        async def some_productive() -> bool:
            status = await master.GetStatus(pb.GetStatusRequest())
            return trainer_seconds(status).get("productive", 0) >= 3

        await wait_for(some_productive, timeout=60, message="no productive seconds counted")
        status = await master.GetStatus(pb.GetStatusRequest())
        now = time.monotonic()
    figures = trainer_seconds(status)
    assert set(figures) == set(CAUSES)
    # one slot read (productive) once its trainer took a task; the other never had a trainer
    # (startup all along, as had the first slot until its trainer registered): startup is at
    # least the productive seconds, to within a sample (1 s)
    assert figures["startup"] >= figures["productive"] - 1.0
    assert figures["idle"] == figures["straggler"] == figures["restart"] == 0
    # two slots counted all along, from a moment between the start and the first serving
    assert 2 * (now - serving) - 2 * 2.5 <= sum(figures.values()) <= 2 * (now - started) + 2 * 2.5
    assert metric(first.metrics_port, 'paddlecloud_master_trainer_seconds_total{cause="productive"}') >= 3

    # the figures reach etcd every few seconds: wait for a write with productive seconds in it
    client = await etcd.connect(first.etcd)
    try:
        async def saved() -> float:
            found = await client.get(JobKeys("local", first.job).goodput)
            return found is not None and json.loads(found.value)["totals"]["productive"]

        written = await wait_for(saved, timeout=30, message="no goodput figures in etcd")
    finally:
        await client.close()
    first.kill()  # SIGKILL: no last write; the next leader counts from the last one
    second = start_master(*args, name="second")
    await wait_serving(second.address, process=second, timeout=60)
    async with grpc.aio.insecure_channel(second.address) as channel:
        status = await pb_grpc.MasterStub(channel).GetStatus(pb.GetStatusRequest())
    after = trainer_seconds(status)
    assert after["productive"] >= written           # it went on from the last write ...
    assert after["failover"] > 0                    # ... and counted the gap as the failover's
    assert sum(after[c] for c in LOST_CAUSES) + after["productive"] >= sum(figures.values())


@pytest.mark.unit
def test_job_status_says_the_productive_share_and_the_lost_seconds_by_cause():
    from paddlecloud.goodput_text import summarize_trainer_seconds

    line = summarize_trainer_seconds({"productive": 820.0, "restart": 100.0, "startup": 66.4,
                                      "idle": 0.2, "failover": 13.4})
    assert line == ("goodput: 82% productive (820 of 1,000 trainer-seconds); "
                    "lost: restart 100s, startup 66s, failover 13s")
    assert summarize_trainer_seconds({"productive": 0.0}) == ""
