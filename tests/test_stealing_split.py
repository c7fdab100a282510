"""Work stealing's cut, as a property: over random record sizes, chunkings and split points,
every record of the data goes to exactly one reader (docs/design.md section 5a).

The parts are the real ones: the master's state machine (`TaskSplit`), its extents and
clipping (master.stealing), the trainer's cursor (trainer_agent.stealing) over the real
readers on real files. Each straggler is asked to split at a random record it reached;
its part and the piece then go on being dealt, split again, and read to their ends; a
reader may die before its finish (its lease lapses: its part goes back and is read again).
Counted are the reads of finished parts, as a model's history counts them.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from master.partition import Partition
from master.state import (
    Assignment,
    JobState,
    MarksLoaded,
    Outcome,
    TaskAssigned,
    TaskFailed,
    TaskFinished,
    TaskReleased,
    TaskSplit,
    TaskStatus,
)
from master.stealing import extent_of, unit_chunks
from paddlecloud.api import pb
from paddlecloud.datasets import FileEntry
from trainer_agent.stealing import _READ_ON, _STOP, TaskCursor

pytestmark = pytest.mark.unit

files_strategy = st.lists(
    st.tuples(st.lists(st.integers(0, 12), min_size=0, max_size=12), st.booleans()),
    min_size=1, max_size=3)


def write_files(directory: Path, shapes) -> tuple[list[FileEntry], Counter]:
    """Files of lines `<file>.<n>:xxx` (the given lengths of x), with or without a last newline."""
    entries, expected = [], Counter()
    for f, (lengths, last_newline) in enumerate(shapes):
        lines = [f"{f}.{n}:" + "x" * length for n, length in enumerate(lengths)]
        text = "\n".join(lines) + ("\n" if last_newline and lines else "")
        path = directory / f"part-{f}.txt"
        path.write_text(text)
        entries.append(FileEntry(str(path), path.stat().st_size))
        expected.update(lines)
    return entries, expected


def as_task(unit: int, attempt: int, chunks, fmt: str) -> pb.Task:
    return pb.Task(id=unit, epoch=0, attempt=attempt, format=fmt,
                   chunks=[pb.Chunk(path=c.path, begin=c.begin, end=c.end) for c in chunks])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes=files_strategy, chunk_bytes=st.integers(1, 64), chunks_per_task=st.integers(1, 3),
       whole_files=st.booleans(), data=st.data())
def test_a_split_never_gives_a_record_to_two_trainers_and_loses_none(
        shapes, chunk_bytes, chunks_per_task, whole_files, data):
    fmt = "file" if whole_files else "lines"
    with tempfile.TemporaryDirectory() as tmp:
        entries, expected = write_files(Path(tmp), shapes)
        partition = Partition(entries, chunk_bytes=chunk_bytes, chunks_per_task=chunks_per_task,
                              splits_files=not whole_files)
        if whole_files:  # one record per non-empty file, the whole of it
            expected = Counter(Path(e.path).read_text() for e in entries if e.size)
        state = JobState.new(num_tasks=partition.num_tasks, num_epochs=1, seed=0, max_failures=3)
        read: Counter = Counter()
        attempt = 0
        while not state.epoch_complete:
            decision = state.decide(session=1, epoch=0, cap=1)
            assert decision.outcome is Outcome.TASK
            unit = decision.task
            attempt += 1
            state.begin(TaskAssigned(unit, Assignment(1, "t", 0, 0.0)))
            state.apply(TaskAssigned(unit, Assignment(1, "t", attempt, 0.0)))
            cursor = TaskCursor(as_task(unit, attempt, unit_chunks(partition, state, unit), fmt))
            records = cursor.read(fmt)
            mine: Counter = Counter()  # what this reader hands out; counted once it finishes
            asked_after = data.draw(st.integers(0, 15), label="records before the split request")
            for _ in range(asked_after):
                record = next(records, None)
                if record is None:
                    break
                mine[record if isinstance(record, str) else record.decode()] += 1
            position = cursor.propose()
            root, lo, hi = extent_of(partition, state, unit)
            at = lo + position
            if at < hi and data.draw(st.booleans(), label="the master wants the split"):
                split = TaskSplit(unit, attempt, root, lo, at, hi, piece=state.units)
                state.begin(split)
                state.apply(split)
                cursor.decide(_STOP)
            else:
                cursor.decide(_STOP if at >= hi else _READ_ON)
            for record in records:  # the straggler reads on to where it was told to stop
                mine[record if isinstance(record, str) else record.decode()] += 1
            if data.draw(st.integers(0, 5), label="the reader dies before its finish") == 5:
                state.begin(TaskReleased(unit, attempt, "expiry"))  # its part goes back, whole
                state.apply(TaskReleased(unit, attempt, "expiry"))
                continue
            state.begin(TaskFinished(unit, attempt))
            state.apply(TaskFinished(unit, attempt))
            read.update(mine)
            assert_restores(state, partition)
        assert state.counts[TaskStatus.DONE] == state.units
        assert read == expected, (read - expected, expected - read)


def assert_restores(state: JobState, partition: Partition) -> None:
    """What etcd would hold of the state (its marks, cut extents) rebuilds it (a failover)."""
    done = [u for u in range(state.units) if state.status[u] == TaskStatus.DONE]
    extents = {u: state.extent(u) for u in range(state.units) if state.extent(u) is not None}
    restored = JobState.new(num_tasks=partition.num_tasks, num_epochs=1, seed=0, max_failures=3)
    restored.apply(MarksLoaded(done=done, extents=extents))
    assert restored == state


def split_state() -> JobState:
    """Two tasks of 100 bytes; task 0 (attempt 5) split at byte 40: piece 2 owns [40, 100)."""
    state = JobState.new(num_tasks=2, num_epochs=2, seed=0, max_failures=3)
    state.begin(TaskAssigned(0, Assignment(1, "t", 0, 0.0)))
    state.apply(TaskAssigned(0, Assignment(1, "t", 5, 0.0)))
    split = TaskSplit(0, 5, root=0, lo=0, at=40, end=100, piece=2)
    state.begin(split)
    state.apply(split)
    return state


def test_a_restart_of_the_epoch_in_progress_keeps_its_cuts_and_another_drops_them():
    from master.state import EpochRestarted

    state = split_state()
    assert state.restart_units(0) == 3 and state.restart_units(1) == 2
    state.apply(EpochRestarted(0, done=(2,)))  # a checkpoint consumed the piece, not task 0's part
    assert (state.units, state.extent(0), state.extent(2)) == (3, (0, 0, 40), (0, 40, 100))
    assert [TaskStatus(s) for s in state.status] == [TaskStatus.TODO, TaskStatus.TODO, TaskStatus.DONE]
    other = split_state()
    other.apply(EpochRestarted(1))
    assert (other.units, other.extent(0)) == (2, None)


def test_a_split_needs_the_live_attempt_and_the_next_piece_id():
    from master.state import InvalidTransition

    state = split_state()
    for wrong in (TaskSplit(0, 4, root=0, lo=0, at=10, end=40, piece=3),    # not the live attempt
                  TaskSplit(0, 5, root=0, lo=0, at=10, end=40, piece=7),    # not the next piece id
                  TaskSplit(0, 5, root=0, lo=0, at=10, end=100, piece=3),   # not what task 0 owns now
                  TaskSplit(0, 5, root=0, lo=0, at=40, end=40, piece=3)):   # nothing past the cut
        try:
            state.apply(wrong)
        except InvalidTransition:
            continue
        raise AssertionError(f"{wrong} applied")
    assert state.units == 3


def apply_written(state: JobState, event) -> None:
    state.begin(event)
    state.apply(event)


def test_a_piece_is_dealt_before_every_task_the_newest_first_and_after_a_failure_with_the_failed():
    """The deal order rule for pieces (master.partition.DealQueue), and a state rebuilt from
    what etcd holds (marks, live assignments, extents) deals in the same order."""
    state = JobState.new(num_tasks=6, num_epochs=1, seed=3, max_failures=3)
    tasks = list(state.todo)
    for attempt, task in enumerate(tasks[:2], start=10):
        apply_written(state, TaskAssigned(task, Assignment(1, "t", attempt, 0.0)))
    apply_written(state, TaskSplit(tasks[0], 10, root=tasks[0], lo=0, at=4, end=9, piece=6))
    apply_written(state, TaskSplit(tasks[1], 11, root=tasks[1], lo=0, at=2, end=9, piece=7))
    assert list(state.todo) == [7, 6, *tasks[2:]]
    apply_written(state, TaskAssigned(7, Assignment(2, "u", 12, 0.0)))
    apply_written(state, TaskFailed(7, 12, "failure", revision=13))
    assert list(state.todo) == [6, *tasks[2:], 7]
    rebuilt = JobState.new(num_tasks=6, num_epochs=1, seed=3, max_failures=3)
    rebuilt.apply(MarksLoaded(failures={7: 1}, failed_at={7: 13},
                              assignments={t: state.pending[t] for t in state.pending},
                              extents={u: state.extent(u) for u in range(state.units) if state.extent(u)}))
    assert list(rebuilt.todo) == list(state.todo) and rebuilt == state
