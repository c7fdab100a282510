"""The master's whole state is one machine (master/machine.py): a master rebuilt from etcd
after any number of events holds the same machine as the one that ran them, the deal order
included; the rooms hear events through subscriptions, not patched hooks."""

from __future__ import annotations

import ast
import random
import typing
from pathlib import Path

import pytest

from master.config import DatasetSpec
from master.core import Core
from master.machine import (
    DatasetAdopted,
    Durable,
    Loaded,
    MasterMachine,
    PhaseRecorded,
    SaveModelGranted,
    SaveModelReleased,
    SessionCalled,
    SessionEnded,
    SessionOpened,
    Snapshot,
    TrainerRangeSet,
    TrainersScaled,
    partition_of,
)
from master.partition import FileEntry
from master.state import (
    Assignment,
    EpochAdvanced,
    EpochRestarted,
    JobFailed,
    Outcome,
    TaskAssigned,
    TaskFailed,
    TaskFinished,
    TaskReleased,
    TaskSplit,
)
from master.stealing import extent_of
from master.store import EtcdStore
from master.tasks import TaskRef
from master.transactions import Transactions
from paddlecloud import etcd
from paddlecloud.elastic import TrainerRange
from paddlecloud.keys import JobKeys
from paddlecloud.phase import Phase
from tests.datasets import write_records
from tests.masters import in_process_master
from tests.waiting import wait_for


async def settled(dispatcher) -> None:
    """Waits for the writes the rooms make in the background (an epoch's end, a grant's release)."""
    core = dispatcher.core

    def quiet() -> bool:
        state = core.state
        return (state is not None and not state.epoch_ending and not state.epoch_complete
                and core.machine.orphan_grant is None) or (state is not None and state.job_over)
    await wait_for(quiet, timeout=60, message="the master's background writes did not settle")


async def recovered(etcd_endpoint: str, job_name: str, dispatcher) -> MasterMachine:
    """The machine a master elected now would hold: a new core loaded from etcd alone."""
    keys = JobKeys("local", job_name)
    client = await etcd.connect(etcd_endpoint)
    try:
        core = Core(store=EtcdStore(client, keys, etcd.Leadership(keys.leader, 1)), config=dispatcher.config)
        await core.load()
        return core.machine
    finally:
        await client.close()


async def step(dispatcher, rng: random.Random, trainers: dict[str, int]) -> str:
    """One call into a room, picked at random: what a trainer, the operator or the deployer does."""
    d = dispatcher
    state = d.core.state
    trainer = rng.choice(sorted(trainers))
    session = trainers[trainer]
    held = [(t, state.pending[t]) for t in state.held_by(session) if t in state.pending]
    kind = rng.choice(["get", "get", "get", "finish", "finish", "fail", "return", "split", "leave",
                       "supersede", "scale", "save", "phase"])
    if kind == "split" and held and await split(d, *rng.choice(held), rng):
        pass
    elif kind in ("finish", "fail", "return") and held:
        task, assignment = rng.choice(held)
        ref = TaskRef(task, state.epoch, assignment.attempt)
        if kind == "finish":
            assert await d.tasks.task_finished(session, ref)
        elif kind == "fail":
            assert await d.tasks.task_failed(session, ref, "bad record")
        else:
            assert await d.tasks.return_task(session, ref)
    elif kind == "leave":
        await d.trainers.leave(session)
        trainers[trainer] = (await d.trainers.register(trainer)).session
    elif kind == "supersede":
        trainers[trainer] = (await d.trainers.register(trainer)).session
    elif kind == "scale":
        await d.scaling.scale(rng.randint(1, 4))
    elif kind == "save":
        await d.save_model.request(session, 30.0)
    elif kind == "phase":
        await d.deployment.record_phase(rng.choice(["Starting", "Running"]))
    else:
        kind = "get"
        result = await d.tasks.get_task(session, state.epoch, [], max_tasks=rng.randint(1, 2))
        assert result.outcome in (Outcome.TASK, Outcome.WAIT), result
    return kind


async def split(dispatcher, task: int, assignment: Assignment, rng: random.Random) -> bool:
    """Work stealing's cut of a held task at a random byte (what `SplitTask` commits once the
    holder agreed): the piece is a unit of the epoch, read back from etcd's extents."""
    core = dispatcher.core
    state = core.state
    root, lo, hi = extent_of(core.partition, state, task)
    if hi - lo < 2:
        return False
    event = TaskSplit(task, assignment.attempt, root, lo, rng.randrange(lo + 1, hi), hi, piece=state.units)
    assert await core.commit(event) is not None
    return True


async def test_a_master_recovered_after_any_number_of_events_holds_the_machine_that_ran(
        tmp_path, etcd_endpoint, job_name):
    write_records(tmp_path / "data", files=2, records_per_file=30)
    async with in_process_master(tmp_path / "data", etcd_endpoint, job_name,
                                 trainer_size=(TrainerRange(1, 4), 2), chunks_per_task=8) as (d, _, _):
        rng = random.Random(31)
        trainers = {f"t{i}": (await d.trainers.register(f"t{i}")).session for i in range(3)}
        kinds, granted = set(), False
        for n in range(60):
            kinds.add(await step(d, rng, trainers))
            await settled(d)
            live = d.core.machine
            rebuilt = await recovered(etcd_endpoint, job_name, d)
            assert rebuilt.tasks is not None and list(rebuilt.tasks.todo) == list(live.tasks.todo), \
                f"after {n + 1} events the deal order differs"
            assert rebuilt == live, f"after {n + 1} events: {rebuilt._durable()} != {live._durable()}"
            granted |= live.save_grant is not None
        state = d.core.state
        # the walk went through every kind of event, failures that requeue among them
        assert kinds == {"get", "finish", "fail", "return", "split", "leave", "supersede", "scale", "save",
                         "phase"}
        assert any(state.failures) and state.counts[0] > 0
        assert granted and d.core.machine.phase is not None


@pytest.mark.unit
def test_a_snapshot_loads_through_the_same_apply_as_the_events_it_stands_for():
    """The trainer range, the sessions: `Loaded` leaves the machine the events did."""
    span = TrainerRange(1, 3)
    live = MasterMachine(max_failures=3)
    for event in [TrainerRangeSet(span, 2), TrainersScaled(span, 3), SessionOpened("a", 11, None, at=5.0),
                  SessionOpened("a", 12, 11, at=6.0), SessionCalled(12, at=7.0, refreshed=True)]:
        live.apply(event)
    loaded = MasterMachine(max_failures=3)
    loaded.apply(Loaded(Snapshot(revision=9, trainers={"a": 12}, superseded={11: "a"},
                                 trainer_range=span, trainers_desired=3), at=1.0))
    assert loaded == live
    live.apply(SessionEnded(12, "expiry"))
    assert loaded != live


@pytest.mark.unit
def test_subscribers_hear_the_events_they_asked_for_after_the_machine_changed():
    machine = MasterMachine(max_failures=3)
    heard = []
    machine.subscribe(lambda e: heard.append((e, machine.sessions.by_trainer.get("a"))), SessionOpened)
    machine.subscribe(lambda e: heard.append((e, "a" in machine.sessions.by_trainer)), SessionEnded)
    opened = SessionOpened("a", 7, None, at=1.0)
    machine.apply(opened)
    machine.apply(SessionCalled(7, at=2.0, refreshed=False))  # nobody asked for it
    machine.apply(SessionEnded(7, "leave"))
    assert heard == [(opened, 7), (SessionEnded(7, "leave"), False)]


@pytest.mark.unit
def test_every_durable_event_is_one_transaction():
    spec = DatasetSpec(paths=("/data",), chunk_bytes=1).filled()
    partition = partition_of(spec, [FileEntry("/data/a", 8)])
    span = TrainerRange(1, 3)
    samples = [
        DatasetAdopted(spec, partition, 0), PhaseRecorded(Phase.RUNNING), TrainerRangeSet(span, 2),
        TrainersScaled(span, 3), SessionOpened("a", 11, 10, at=1.0), SaveModelGranted("a", 12, until=2.0),
        SaveModelReleased("a"), TaskAssigned(1, Assignment(11, "a", 0, 0.0)), TaskFinished(1, 5),
        TaskFailed(1, 5, "failure"), TaskReleased(1, 5, "return"), EpochAdvanced(1), JobFailed(0),
        EpochRestarted(0, (1, 2)), TaskSplit(1, 5, root=1, lo=0, at=1, end=2, piece=8),
    ]
    assert {type(e) for e in samples} == set(typing.get_args(Durable)), "an event without a sample here"
    machine = MasterMachine(max_failures=3)
    machine.apply(DatasetAdopted(spec, partition, 0))
    transactions = Transactions(JobKeys("local", "job-x"))
    for event in samples:
        txn = transactions.txn_for(event, machine)
        assert txn.op.WhichOneof("request") == "request_txn" and txn.width >= 1, event


@pytest.mark.unit
def test_the_machine_reads_no_clock():
    """Times enter as event data (`SessionOpened.at`, `SessionCalled.at`, ...), never read inside."""
    root = Path(__file__).resolve().parent.parent / "master"
    for module in ("machine.py", "state.py", "sessions.py"):
        tree = ast.parse((root / module).read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not imported & {"time", "datetime", "asyncio"}, module
