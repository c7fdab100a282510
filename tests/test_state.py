"""The pure task state machine `master.state.JobState`: every transition, every refused
transition, the GetTask outcomes table (docs/design.md section 3), the task life cycle
(section 5), and restore-from-etcd. No etcd, no clock, no I/O."""

from __future__ import annotations

import copy
import itertools
import random

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from master.partition import task_order
from master.state import (
    Assignment,
    Decision,
    EpochAdvanced,
    EpochRestarted,
    InvalidTransition,
    JobFailed,
    JobState,
    MarksLoaded,
    Outcome,
    ReservationCancelled,
    TaskAssigned,
    TaskFailed,
    TaskFinished,
    TaskReleased,
    TaskReserved,
    TaskStatus,
)
from paddlecloud.phase import Phase

pytestmark = pytest.mark.unit

S1, S2, S3 = 0x11, 0x22, 0x33
RELEASE_CAUSES = ("expiry", "leave", "superseded", "return")
FAIL_CAUSES = ("failure", "deadline")


# ---- helpers --------------------------------------------------------------------------


def deal_order(state: JobState) -> list[int]:
    """The deal order as docs/design.md section 5 defines it from what etcd holds: the healthy
    tasks left by permutation position, then the failed ones by their last failure's revision."""
    order = task_order(state.num_tasks, seed=state.seed, epoch=state.epoch)
    todo = [t for t in range(state.num_tasks) if state.status[t] == TaskStatus.TODO]
    healthy = sorted((t for t in todo if not state.failures[t]), key=order.index)
    failed = sorted((t for t in todo if state.failures[t]),
                    key=lambda t: (state.failed_at[t], order.index(t)))
    return healthy + failed


def check(state: JobState) -> None:
    """Every structural invariant of JobState, recomputed from `status`."""
    n = state.num_tasks
    assert len(state.status) == n
    assert len(state.failures) == n
    recount = [0] * 5
    for s in state.status:
        recount[s] += 1
    assert state.counts == recount, f"counts {state.counts} != recomputed {recount}"
    assert sum(state.counts) == n

    by = {st_: {t for t in range(n) if state.status[t] == st_} for st_ in TaskStatus}
    # todo: no duplicates, exactly the TODO tasks
    assert len(state.todo) == len(set(state.todo)), f"duplicates in todo {list(state.todo)}"
    assert set(state.todo) == by[TaskStatus.TODO]
    assert list(state.todo) == deal_order(state), "the deal order is not a function of the marks"
    assert set(state.reserved) == by[TaskStatus.RESERVED]
    assert set(state.pending) == by[TaskStatus.PENDING]
    # each task in exactly one of todo/reserved/pending/done/failed
    containers = [set(state.todo), set(state.reserved), set(state.pending),
                  by[TaskStatus.DONE], by[TaskStatus.FAILED]]
    for task in range(n):
        assert sum(task in c for c in containers) == 1, f"task {task} in {containers}"
    # held: exactly the reserved + pending tasks, per session, no empty entries
    expected: dict[int, set[int]] = {}
    for task, session in state.reserved.items():
        expected.setdefault(session, set()).add(task)
    for task, a in state.pending.items():
        expected.setdefault(a.session, set()).add(task)
    assert {s: set(ts) for s, ts in state.held.items()} == expected
    assert all(state.held.values()), "a session with no task must not stay in held"
    # failure counts: only a FAILED task is past the limit
    for task in range(n):
        past = state.failures[task] > state.max_failures
        assert past == (state.status[task] == TaskStatus.FAILED) or state.job_over
    if state.job_over and not state.failed_job:
        assert state.counts == [0, 0, 0, n, 0]


class Harness:
    """A JobState driven the way the dispatcher drives it, checked after every event."""

    def __init__(self, num_tasks: int = 10, num_epochs: int = 3, seed: int = 0,
                 max_failures: int = 3, epoch: int = 0, cap: int = 2) -> None:
        self.state = JobState.new(num_tasks=num_tasks, num_epochs=num_epochs, seed=seed,
                                  max_failures=max_failures, epoch=epoch)
        self.cap = cap
        self.attempts = itertools.count(100)
        check(self.state)

    def apply(self, event) -> None:
        self.state.apply(event)
        check(self.state)

    def refused(self, event) -> None:
        """The event raises InvalidTransition and leaves the state exactly as it was."""
        before = copy.deepcopy(self.state)
        with pytest.raises(InvalidTransition):
            self.state.apply(event)
        assert self.state == before
        assert held_in_order(self.state) == held_in_order(before)
        check(self.state)

    def reserve(self, session: int = S1) -> int:
        d = self.state.decide(session=session, epoch=self.state.epoch, cap=self.cap)
        assert d.outcome is Outcome.TASK and d.held is None, d
        self.apply(TaskReserved(d.task, session))
        return d.task

    def assign(self, task: int, session: int = S1, deadline: float = 0.0) -> Assignment:
        a = Assignment(session, f"trainer-{session:x}", next(self.attempts), deadline)
        self.apply(TaskAssigned(task, a))
        return a

    def dispatch(self, session: int = S1, deadline: float = 0.0) -> tuple[int, Assignment]:
        task = self.reserve(session)
        return task, self.assign(task, session, deadline)

    def finish(self, task: int) -> None:
        self.apply(TaskFinished(task, self.state.pending[task].attempt))

    def fail(self, task: int, cause: str = "failure") -> None:
        self.apply(TaskFailed(task, self.state.pending[task].attempt, cause, next(self.attempts)))

    def release(self, task: int, cause: str = "return") -> None:
        self.apply(TaskReleased(task, self.state.pending[task].attempt, cause))

    def decide(self, session: int = S1, epoch: int | None = None,
               releasing: frozenset[int] = frozenset()) -> Decision:
        """decide() while the finishes of `releasing` are being written (begun, not applied)."""
        finishes = [TaskFinished(t, self.state.pending[t].attempt) for t in sorted(releasing)]
        for finish in finishes:
            self.state.begin(finish)
        before = copy.deepcopy(self.state)
        d = self.state.decide(session=session, epoch=self.state.epoch if epoch is None else epoch,
                              cap=self.cap)
        assert self.state == before, "decide must not change the state"
        for finish in finishes:
            self.state.abandon(finish)
        check(self.state)
        return d

    def finish_epoch(self, session: int = S1) -> None:
        """Hands out and finishes every task left, then advances."""
        while self.state.todo:
            task, _ = self.dispatch(session)
            self.finish(task)
        for task in list(self.state.pending):
            self.finish(task)
        assert self.state.epoch_complete
        self.apply(EpochAdvanced(self.state.epoch + 1))


def held_in_order(state: JobState) -> list[tuple[int, list[int]]]:
    return [(session, list(tasks)) for session, tasks in state.held.items()]


def statuses(state: JobState) -> list[TaskStatus]:
    return [TaskStatus(s) for s in state.status]


# ---- a new job ------------------------------------------------------------------------


def test_new_job_has_every_task_todo_in_the_shuffled_deal_order():
    h = Harness(num_tasks=12, seed=5)
    s = h.state
    assert list(s.todo) == list(task_order(12, seed=5, epoch=0))
    assert s.counts == [12, 0, 0, 0, 0]
    assert s.epoch == 0 and not s.failed_job and not s.job_over
    assert s.phase is Phase.RUNNING
    assert not s.epoch_complete
    assert list(s.failures) == [0] * 12


def test_new_job_may_start_at_a_later_epoch():
    h = Harness(num_tasks=8, num_epochs=5, seed=3, epoch=3)
    assert h.state.epoch == 3
    assert list(h.state.todo) == list(task_order(8, seed=3, epoch=3))
    assert h.decide(epoch=2).outcome is Outcome.EPOCH_DONE


def test_new_job_started_past_its_last_epoch_is_already_done():
    h = Harness(num_tasks=4, num_epochs=2, epoch=2)
    assert h.state.job_over
    assert h.state.phase is Phase.SUCCEEDED
    assert h.state.counts == [0, 0, 0, 4, 0]
    assert statuses(h.state) == [TaskStatus.DONE] * 4
    assert h.decide(epoch=0).outcome is Outcome.JOB_DONE


# ---- TaskReserved ---------------------------------------------------------------------


def test_reserving_the_front_task_moves_it_from_todo_to_reserved_and_holds_it():
    h = Harness(num_tasks=5)
    first = h.state.todo[0]
    h.apply(TaskReserved(first, S1))
    assert h.state.status[first] == TaskStatus.RESERVED
    assert first not in h.state.todo
    assert h.state.reserved == {first: S1}
    assert h.state.held_by(S1) == [first]
    assert h.state.counts == [4, 1, 0, 0, 0]


def test_reserving_a_task_from_the_middle_of_todo_keeps_the_others_in_order():
    h = Harness(num_tasks=6)
    order = list(h.state.todo)
    h.apply(TaskReserved(order[3], S1))
    assert list(h.state.todo) == order[:3] + order[4:]


@pytest.mark.parametrize("make", ["reserved", "pending", "done", "failed"])
def test_reserving_a_task_that_is_not_todo_is_refused(make):
    h = Harness(num_tasks=4, max_failures=0)
    task, _ = h.dispatch()
    if make == "reserved":
        h.release(task)
        task = h.reserve()
    elif make == "done":
        h.finish(task)
    elif make == "failed":
        h.fail(task)
        assert h.state.status[task] == TaskStatus.FAILED
    h.refused(TaskReserved(task, S2))


@pytest.mark.parametrize("task", [-1, 4, 100])
def test_reserving_a_task_id_out_of_range_is_refused(task):
    Harness(num_tasks=4).refused(TaskReserved(task, S1))


# ---- ReservationCancelled -------------------------------------------------------------


def test_cancelled_reservation_returns_the_task_to_its_place_in_todo():
    h = Harness(num_tasks=5)
    order = list(h.state.todo)
    h.apply(TaskReserved(order[2], S1))
    h.apply(ReservationCancelled(order[2]))
    assert list(h.state.todo) == order
    assert h.state.status[order[2]] == TaskStatus.TODO
    assert h.state.reserved == {} and h.state.held == {}
    assert h.state.failures[order[2]] == 0


def test_cancelling_a_reservation_keeps_the_sessions_other_tasks():
    h = Harness(num_tasks=5)
    kept, _ = h.dispatch()
    cancelled = h.reserve()
    h.apply(ReservationCancelled(cancelled))
    assert h.state.held_by(S1) == [kept]


@pytest.mark.parametrize("make", ["todo", "pending", "done", "out-of-range"])
def test_cancelling_a_task_that_is_not_reserved_is_refused(make):
    h = Harness(num_tasks=4)
    task = h.state.todo[0]
    if make == "pending":
        task, _ = h.dispatch()
    elif make == "done":
        task, _ = h.dispatch()
        h.finish(task)
    elif make == "out-of-range":
        task = 4
    h.refused(ReservationCancelled(task))


# ---- TaskAssigned ---------------------------------------------------------------------


def test_assigning_a_reserved_task_makes_it_pending_with_its_assignment():
    h = Harness(num_tasks=3)
    task = h.reserve(S1)
    a = h.assign(task, S1, deadline=123.0)
    assert h.state.status[task] == TaskStatus.PENDING
    assert h.state.pending == {task: a}
    assert h.state.reserved == {}
    assert h.state.held_by(S1) == [task]
    assert h.state.live_assignment(task, 0, a.attempt) == a
    assert h.state.counts == [2, 0, 1, 0, 0]


def test_assigning_a_task_reserved_for_another_session_is_refused_and_keeps_the_reservation():
    h = Harness(num_tasks=3)
    task = h.reserve(S1)
    h.refused(TaskAssigned(task, Assignment(S2, "other", 7, 0.0)))
    assert h.state.reserved == {task: S1}
    # the right session can still complete its dispatch, or cancel it
    h.assign(task, S1)
    assert h.state.pending[task].session == S1


@pytest.mark.parametrize("make", ["todo", "pending", "done"])
def test_assigning_a_task_that_is_not_reserved_is_refused(make):
    h = Harness(num_tasks=3)
    task = h.state.todo[0]
    if make != "todo":
        task, _ = h.dispatch()
    if make == "done":
        h.finish(task)
    h.refused(TaskAssigned(task, Assignment(S1, "t", 999, 0.0)))


# ---- TaskFinished ---------------------------------------------------------------------


def test_finishing_the_live_attempt_marks_the_task_done_and_frees_the_slot():
    h = Harness(num_tasks=3)
    task, a = h.dispatch()
    h.apply(TaskFinished(task, a.attempt))
    assert h.state.status[task] == TaskStatus.DONE
    assert h.state.pending == {} and h.state.held == {}
    assert h.state.live_assignment(task, 0, a.attempt) is None
    assert h.state.counts == [2, 0, 0, 1, 0]


def test_finishing_with_a_stale_attempt_is_refused_and_changes_nothing():
    h = Harness(num_tasks=3)
    task, a = h.dispatch()
    h.refused(TaskFinished(task, a.attempt - 1))
    h.refused(TaskFinished(task, a.attempt + 1))
    assert h.state.pending[task] == a


def test_a_finished_task_reported_finished_again_is_refused():
    h = Harness(num_tasks=3)
    task, a = h.dispatch()
    h.finish(task)
    h.refused(TaskFinished(task, a.attempt))


def test_a_finished_task_then_reported_failed_is_refused():
    """At this level an InvalidTransition; the dispatcher answers STALE."""
    h = Harness(num_tasks=3)
    task, a = h.dispatch()
    h.finish(task)
    for cause in FAIL_CAUSES:
        h.refused(TaskFailed(task, a.attempt, cause))
    h.refused(TaskReleased(task, a.attempt, "return"))
    assert h.state.status[task] == TaskStatus.DONE
    assert h.state.failures[task] == 0


def test_the_old_attempt_of_a_released_and_redispatched_task_is_refused():
    h = Harness(num_tasks=1)
    task, old = h.dispatch()
    h.release(task, "expiry")
    task2, new = h.dispatch(S2)
    assert task2 == task and new.attempt > old.attempt
    h.refused(TaskFinished(task, old.attempt))
    h.refused(TaskFailed(task, old.attempt, "failure"))
    assert h.state.live_assignment(task, 0, old.attempt) is None
    assert h.state.live_assignment(task, 0, new.attempt) == new
    h.apply(TaskFinished(task, new.attempt))


@pytest.mark.parametrize("make", ["todo", "reserved", "failed", "out-of-range"])
def test_finishing_a_task_that_is_not_pending_is_refused(make):
    h = Harness(num_tasks=3, max_failures=0)
    task = h.state.todo[0]
    if make == "reserved":
        task = h.reserve()
    elif make == "failed":
        task, _ = h.dispatch()
        h.fail(task)
    elif make == "out-of-range":
        task = 3
    h.refused(TaskFinished(task, 1))


# ---- TaskFailed -----------------------------------------------------------------------


@pytest.mark.parametrize("cause", FAIL_CAUSES)
def test_a_failure_counts_and_requeues_the_task_at_the_back(cause):
    h = Harness(num_tasks=5, max_failures=3)
    task, _ = h.dispatch()
    h.fail(task, cause)
    assert h.state.status[task] == TaskStatus.TODO
    assert h.state.failures[task] == 1
    assert h.state.todo[-1] == task
    assert h.state.held == {} and h.state.pending == {}


@pytest.mark.parametrize("cause", FAIL_CAUSES)
def test_a_task_failing_max_failures_plus_one_times_ends_failed_for_the_epoch(cause):
    h = Harness(num_tasks=3, max_failures=2)
    victim = h.state.todo[0]
    for n in range(1, 4):
        # deal until the victim comes up (it is requeued at the back each time)
        while True:
            task, _ = h.dispatch(S1)
            if task == victim:
                break
            h.finish(task)
        h.fail(victim, cause)
        assert h.state.failures[victim] == n
        expected = TaskStatus.FAILED if n == 3 else TaskStatus.TODO
        assert h.state.status[victim] == expected
    assert victim not in h.state.todo
    # nothing hands the failed task out again this epoch
    while h.state.todo:
        task, _ = h.dispatch(S2)
        assert task != victim
        h.finish(task)
    assert h.state.counts == [0, 0, 0, 2, 1]
    assert h.state.epoch_complete and not h.state.all_failed
    assert h.decide(S3).outcome is Outcome.WAIT
    h.refused(JobFailed(0))
    h.apply(EpochAdvanced(1))
    # the next epoch offers it again, with a fresh count
    assert h.state.status[victim] == TaskStatus.TODO
    assert victim in h.state.todo
    assert h.state.failures[victim] == 0
    assert list(h.state.todo) == list(task_order(3, seed=0, epoch=1))


def test_with_max_failures_zero_the_first_failure_is_final():
    h = Harness(num_tasks=2, max_failures=0)
    task, _ = h.dispatch()
    h.fail(task)
    assert h.state.status[task] == TaskStatus.FAILED


def test_an_epoch_ends_on_a_failure_when_that_was_the_last_task():
    h = Harness(num_tasks=2, max_failures=0)
    a, _ = h.dispatch()
    h.finish(a)
    b, _ = h.dispatch()
    assert not h.state.epoch_complete
    h.fail(b, "deadline")
    assert h.state.epoch_complete


def test_a_failure_with_a_stale_attempt_is_refused_and_counts_nothing():
    h = Harness(num_tasks=2)
    task, a = h.dispatch()
    h.refused(TaskFailed(task, a.attempt + 1, "failure"))
    assert h.state.failures[task] == 0


# ---- TaskReleased ---------------------------------------------------------------------


@pytest.mark.parametrize("cause", RELEASE_CAUSES)
def test_a_released_task_goes_to_the_front_of_todo_and_counts_no_failure(cause):
    h = Harness(num_tasks=5)
    task, _ = h.dispatch()
    h.release(task, cause)
    assert h.state.todo[0] == task
    assert h.state.status[task] == TaskStatus.TODO
    assert h.state.failures[task] == 0
    assert h.state.held == {}
    # it is the next one dealt
    assert h.decide(S2).task == task


def test_released_tasks_jump_ahead_of_failed_ones():
    h = Harness(num_tasks=6, cap=3)
    failed, _ = h.dispatch()
    released, _ = h.dispatch()
    h.fail(failed)
    h.release(released, "leave")
    assert h.state.todo[0] == released
    assert h.state.todo[-1] == failed


def test_releasing_with_a_stale_attempt_is_refused():
    h = Harness(num_tasks=2)
    task, a = h.dispatch()
    h.refused(TaskReleased(task, a.attempt - 1, "expiry"))


@pytest.mark.parametrize("make", ["todo", "reserved", "done"])
def test_releasing_a_task_that_is_not_pending_is_refused(make):
    h = Harness(num_tasks=3)
    task = h.state.todo[0]
    if make == "reserved":
        task = h.reserve()
    elif make == "done":
        task, _ = h.dispatch()
        h.finish(task)
    h.refused(TaskReleased(task, 1, "return"))


# ---- EpochAdvanced --------------------------------------------------------------------


def test_the_epoch_advances_only_once_every_task_is_done_or_failed():
    h = Harness(num_tasks=3, num_epochs=3)
    h.refused(EpochAdvanced(1))
    a, _ = h.dispatch()
    b, _ = h.dispatch()
    h.finish(a)
    h.refused(EpochAdvanced(1))  # b pending, one todo
    h.finish(b)
    c = h.reserve()
    h.refused(EpochAdvanced(1))  # c reserved
    h.assign(c)
    h.refused(EpochAdvanced(1))  # c pending
    h.finish(c)
    assert h.state.epoch_complete
    h.refused(EpochAdvanced(0))
    h.refused(EpochAdvanced(2))
    h.apply(EpochAdvanced(1))
    assert h.state.epoch == 1
    assert h.state.counts == [3, 0, 0, 0, 0]
    assert list(h.state.todo) == list(task_order(3, seed=0, epoch=1))


def test_advancing_past_the_last_epoch_finishes_the_job():
    h = Harness(num_tasks=3, num_epochs=1)
    h.finish_epoch()
    s = h.state
    assert s.epoch == 1 and s.job_over and not s.epoch_complete
    assert s.phase is Phase.SUCCEEDED
    assert s.counts == [0, 0, 0, 3, 0]
    assert statuses(s) == [TaskStatus.DONE] * 3
    for epoch in (0, 1, 5):
        assert h.decide(epoch=epoch).outcome is Outcome.JOB_DONE
    h.refused(EpochAdvanced(2))
    h.refused(TaskReserved(0, S1))
    h.refused(JobFailed(1))


# ---- EpochRestarted -------------------------------------------------------------------


def test_restarting_an_epoch_drops_every_mark_and_assignment_and_deals_afresh():
    h = Harness(num_tasks=6, num_epochs=4, seed=9, max_failures=5, cap=3)
    h.finish_epoch()
    h.finish_epoch()
    assert h.state.epoch == 2
    a, _ = h.dispatch(S1)
    b, _ = h.dispatch(S2)
    h.finish(a)
    h.fail(b)
    h.reserve(S3)
    h.apply(EpochRestarted(1))
    s = h.state
    assert s.epoch == 1
    assert s.counts == [6, 0, 0, 0, 0]
    assert s.pending == {} and s.reserved == {} and s.held == {}
    assert list(s.failures) == [0] * 6
    assert list(s.todo) == list(task_order(6, seed=9, epoch=1))


@pytest.mark.parametrize("epoch", [-1, 3, 10])
def test_restarting_an_epoch_outside_the_job_is_refused(epoch):
    Harness(num_tasks=2, num_epochs=3).refused(EpochRestarted(epoch))


def test_restarting_a_finished_job_at_its_last_epoch_runs_it_again():
    h = Harness(num_tasks=2, num_epochs=2)
    h.finish_epoch()
    h.finish_epoch()
    assert h.state.phase is Phase.SUCCEEDED
    h.apply(EpochRestarted(1))
    assert h.state.phase is Phase.RUNNING
    assert h.decide().outcome is Outcome.TASK


def test_restarting_a_failed_job_clears_the_failure():
    h = Harness(num_tasks=1, num_epochs=2, max_failures=0)
    task, _ = h.dispatch()
    h.fail(task)
    h.apply(JobFailed(0))
    assert h.state.phase is Phase.FAILED
    h.apply(EpochRestarted(0))
    assert not h.state.failed_job
    assert h.state.phase is Phase.RUNNING
    assert h.decide().outcome is Outcome.TASK


# ---- JobFailed ------------------------------------------------------------------------


def test_the_job_fails_when_every_task_of_the_epoch_failed():
    h = Harness(num_tasks=3, num_epochs=3, max_failures=0, cap=3)
    tasks = [h.dispatch()[0] for _ in range(3)]
    for t in tasks[:2]:
        h.fail(t)
    h.refused(JobFailed(0))  # one still pending
    h.fail(tasks[2])
    assert h.state.all_failed and h.state.epoch_complete
    h.refused(JobFailed(1))  # wrong epoch
    h.apply(JobFailed(0))
    s = h.state
    assert s.failed_job and s.job_over and s.phase is Phase.FAILED
    assert s.counts == [0, 0, 0, 0, 3]
    for epoch in (0, 1, 2, 7):
        assert h.decide(epoch=epoch).outcome is Outcome.ALL_TASKS_FAILED
    with pytest.raises(ValueError):
        h.decide(epoch=-1)
    h.refused(EpochAdvanced(1))


def test_the_job_does_not_fail_when_one_task_was_done():
    h = Harness(num_tasks=3, max_failures=0)
    first, _ = h.dispatch()
    h.finish(first)
    while h.state.todo:
        task, _ = h.dispatch()
        h.fail(task)
    assert h.state.epoch_complete and not h.state.all_failed
    h.refused(JobFailed(0))
    h.apply(EpochAdvanced(1))


# ---- decide: the GetTask outcomes table -----------------------------------------------


@pytest.mark.parametrize("asked, outcome", [
    (0, Outcome.EPOCH_DONE),
    (1, Outcome.EPOCH_DONE),
    (2, Outcome.TASK),
    (3, Outcome.WAIT),
    (4, Outcome.WAIT),
    (5, Outcome.JOB_DONE),
    (6, Outcome.JOB_DONE),
    (10**9, Outcome.JOB_DONE),
])
def test_outcomes_table_by_asked_epoch(asked, outcome):
    h = Harness(num_tasks=4, num_epochs=5)
    h.finish_epoch()
    h.finish_epoch()
    assert h.state.epoch == 2
    d = h.decide(epoch=asked)
    assert d.outcome is outcome
    if outcome is Outcome.TASK:
        assert d.task == h.state.todo[0] and d.held is None
    else:
        assert d.task is None and d.held is None


@pytest.mark.parametrize("asked", [-1, -100])
def test_a_negative_epoch_is_a_value_error_naming_it(asked):
    h = Harness()
    with pytest.raises(ValueError, match=str(asked)):
        h.decide(epoch=asked)


def test_a_negative_epoch_is_refused_even_when_the_job_is_over():
    h = Harness(num_tasks=1, num_epochs=1)
    h.finish_epoch()
    with pytest.raises(ValueError):
        h.decide(epoch=-1)


def test_current_epoch_with_every_task_held_by_others_answers_wait():
    h = Harness(num_tasks=2, cap=2)
    h.dispatch(S1)
    h.dispatch(S2)
    assert not h.state.todo
    assert h.decide(S3).outcome is Outcome.WAIT


def test_current_epoch_with_the_last_task_only_reserved_answers_wait_to_others():
    h = Harness(num_tasks=1)
    h.reserve(S1)
    assert h.decide(S2).outcome is Outcome.WAIT


def test_the_task_offered_is_the_front_of_todo():
    h = Harness(num_tasks=10, seed=4, cap=10)
    dealt = [h.dispatch()[0] for _ in range(10)]
    assert dealt == list(task_order(10, seed=4, epoch=0))


# ---- decide: the per-trainer cap ------------------------------------------------------


def test_session_at_cap_gets_its_oldest_task_again_with_the_same_attempt():
    h = Harness(num_tasks=10, cap=2)
    oldest, a_old = h.dispatch(S1)
    newer, _ = h.dispatch(S1)
    d = h.decide(S1)
    assert d.outcome is Outcome.TASK
    assert d.task == oldest
    assert d.held == a_old and d.held.attempt == a_old.attempt
    # once the oldest finishes the session is below the cap again and gets a new task
    h.finish(oldest)
    d = h.decide(S1)
    assert d.outcome is Outcome.TASK and d.held is None and d.task not in (oldest, newer)


def test_session_at_cap_is_resent_its_oldest_pending_task_not_a_reserved_one():
    h = Harness(num_tasks=10, cap=2)
    reserved = h.reserve(S1)
    pending, a = h.dispatch(S1)
    d = h.decide(S1)
    assert (d.outcome, d.task, d.held) == (Outcome.TASK, pending, a)
    assert d.task != reserved


def test_session_at_cap_holding_only_reservations_waits():
    h = Harness(num_tasks=10, cap=1)
    h.reserve(S1)
    assert h.decide(S1).outcome is Outcome.WAIT


def test_the_cap_is_per_session():
    h = Harness(num_tasks=10, cap=1)
    h.dispatch(S1)
    d = h.decide(S2)
    assert d.outcome is Outcome.TASK and d.held is None


def test_tasks_being_released_do_not_count_against_the_cap():
    h = Harness(num_tasks=10, cap=2)
    a, _ = h.dispatch(S1)
    b, _ = h.dispatch(S1)
    d = h.decide(S1, releasing=frozenset({a}))
    assert d.outcome is Outcome.TASK and d.held is None
    assert d.task == h.state.todo[0]
    d = h.decide(S1, releasing=frozenset({a, b}))
    assert d.outcome is Outcome.TASK and d.held is None


def test_tasks_being_released_are_not_sent_again():
    h = Harness(num_tasks=2, cap=2)
    a, _ = h.dispatch(S1)
    b, b_assignment = h.dispatch(S1)
    assert not h.state.todo
    d = h.decide(S1, releasing=frozenset({a}))
    assert (d.outcome, d.task, d.held) == (Outcome.TASK, b, b_assignment)
    assert h.decide(S1, releasing=frozenset({a, b})).outcome is Outcome.WAIT


def test_with_todo_empty_a_session_holding_a_task_gets_it_again_rather_than_wait():
    h = Harness(num_tasks=2, cap=5)
    a, a_assignment = h.dispatch(S1)
    h.dispatch(S2)
    assert not h.state.todo
    d = h.decide(S1)
    assert (d.outcome, d.task, d.held) == (Outcome.TASK, a, a_assignment)
    # a session holding nothing waits
    assert h.decide(S3).outcome is Outcome.WAIT


def test_a_session_is_never_sent_another_sessions_task():
    h = Harness(num_tasks=3, cap=1)
    mine, _ = h.dispatch(S1)
    theirs = {h.dispatch(S2)[0], h.dispatch(S3)[0]}
    for _ in range(3):
        d = h.decide(S1)
        assert d.task == mine and d.task not in theirs


# ---- expired --------------------------------------------------------------------------


def test_expired_yields_only_pending_tasks_past_their_deadline():
    h = Harness(num_tasks=6, cap=6)
    never, _ = h.dispatch(deadline=0.0)
    early, a_early = h.dispatch(deadline=100.0)
    late, a_late = h.dispatch(deadline=200.0)
    h.reserve()  # reserved tasks have no deadline yet
    assert list(h.state.expired(50.0)) == []
    assert list(h.state.expired(99.999)) == []
    assert dict(h.state.expired(100.0)) == {early: a_early}
    assert dict(h.state.expired(150.0)) == {early: a_early}
    assert dict(h.state.expired(1e12)) == {early: a_early, late: a_late}
    assert never not in dict(h.state.expired(float("inf")))


def test_a_finished_task_no_longer_expires():
    h = Harness(num_tasks=2)
    task, _ = h.dispatch(deadline=10.0)
    h.finish(task)
    assert list(h.state.expired(100.0)) == []


def test_failing_an_expired_task_by_deadline_counts_a_failure():
    h = Harness(num_tasks=2, max_failures=1)
    task, _ = h.dispatch(deadline=10.0)
    [(expired, a)] = h.state.expired(11.0)
    h.apply(TaskFailed(expired, a.attempt, "deadline"))
    assert h.state.failures[task] == 1
    assert list(h.state.expired(11.0)) == []


# ---- the deal order -------------------------------------------------------------------


def test_the_deal_order_is_reproducible_from_seed_and_epoch():
    a = JobState.new(num_tasks=50, num_epochs=3, seed=42, max_failures=3)
    b = JobState.new(num_tasks=50, num_epochs=3, seed=42, max_failures=3)
    assert list(a.todo) == list(b.todo)
    assert sorted(a.todo) == list(range(50))
    assert list(a.todo) != list(range(50))


def test_the_deal_order_changes_with_the_epoch_and_the_seed():
    orders = {}
    for seed, epoch in [(42, 0), (42, 1), (42, 2), (43, 0)]:
        s = JobState.new(num_tasks=50, num_epochs=3, seed=seed, max_failures=3, epoch=epoch)
        orders[seed, epoch] = list(s.todo)
    assert len({tuple(o) for o in orders.values()}) == 4


def test_each_epoch_is_dealt_in_its_own_reproducible_order():
    h = Harness(num_tasks=50, num_epochs=3, seed=1, cap=50)
    for epoch in range(3):
        dealt = [h.dispatch()[0] for _ in range(50)]
        assert dealt == list(task_order(50, seed=1, epoch=epoch))
        for t in dealt:
            h.finish(t)
        h.apply(EpochAdvanced(epoch + 1))


# ---- a whole job ----------------------------------------------------------------------


def test_simulation_20_tasks_10_epochs_each_task_dealt_once_per_epoch():
    n, epochs = 20, 10
    h = Harness(num_tasks=n, num_epochs=epochs, seed=2024, cap=5)
    trainers = [S1, S2, S3, 0x44]
    for epoch in range(epochs):
        dealt: list[int] = []
        for i in range(n):
            task, a = h.dispatch(trainers[i % 4])
            assert h.state.live_assignment(task, epoch, a.attempt) == a
            dealt.append(task)
        assert sorted(dealt) == list(range(n)), "each task exactly once"
        assert dealt == list(task_order(n, seed=2024, epoch=epoch))
        # a 21st request from a trainer with nothing in hand waits
        assert h.decide(0x55).outcome is Outcome.WAIT
        # one already at its cap is resent its oldest
        assert h.decide(S1).task == dealt[0]
        assert h.state.counts == [0, 0, n, 0, 0]
        for task in reversed(dealt):
            assert not h.state.epoch_complete
            h.finish(task)
        assert h.state.epoch_complete
        h.refused(TaskFinished(dealt[0], 0))
        h.apply(EpochAdvanced(epoch + 1))
    assert h.state.job_over and h.state.phase is Phase.SUCCEEDED
    assert h.decide(0x55, epoch=epochs - 1).outcome is Outcome.JOB_DONE


# ---- restore --------------------------------------------------------------------------


def etcd_view(state: JobState) -> dict:
    """What etcd holds for the state: done and failure marks (with their keys' revisions),
    live assignments (by key order)."""
    return dict(
        num_tasks=state.num_tasks, num_epochs=state.num_epochs, seed=state.seed,
        max_failures=state.max_failures, epoch=state.epoch, failed_job=state.failed_job,
        done=[t for t in range(state.num_tasks) if state.status[t] == TaskStatus.DONE],
        failures={t: c for t, c in enumerate(state.failures) if c},
        failed_at=dict(state.failed_at),
        assignments=dict(sorted(state.pending.items())),
    )


def from_etcd(*, num_tasks: int, num_epochs: int, seed: int, max_failures: int, epoch: int,
              **marks) -> JobState:
    """The state a master rebuilt from etcd holds: begun at etcd's epoch, then its marks
    applied through the same `apply` (`MarksLoaded`)."""
    state = JobState.new(num_tasks=num_tasks, num_epochs=num_epochs, seed=seed,
                         max_failures=max_failures, epoch=epoch)
    state.apply(MarksLoaded(**marks))
    return state


def assert_same(restored: JobState, live: JobState) -> None:
    check(restored)
    assert restored.epoch == live.epoch
    assert restored.failed_job == live.failed_job
    assert restored.phase is live.phase
    assert statuses(restored) == statuses(live)
    assert restored.counts == live.counts
    assert list(restored.failures) == list(live.failures)
    assert restored.pending == live.pending
    assert {s: list(t) for s, t in restored.held.items()} == {s: list(t) for s, t in live.held.items()}
    assert list(restored.todo) == list(live.todo)  # the deal order too
    assert restored == live


def test_restore_of_a_fresh_epoch_equals_a_new_state():
    live = JobState.new(num_tasks=15, num_epochs=4, seed=8, max_failures=3, epoch=2)
    assert_same(from_etcd(**etcd_view(live)), live)


def test_restore_reproduces_the_live_state_mid_epoch():
    h = Harness(num_tasks=12, num_epochs=3, seed=6, max_failures=1, cap=3)
    h.finish_epoch()
    # epoch 1: a mix of everything, in dealing order so todo order is comparable
    d1, _ = h.dispatch(S1)
    h.finish(d1)
    f1, _ = h.dispatch(S1)
    h.fail(f1)          # failures 1, back of todo
    p1, _ = h.dispatch(S1)
    p2, _ = h.dispatch(S2)
    p3, _ = h.dispatch(S1)
    assert h.state.held_by(S1) == [p1, p3]
    live = h.state
    restored = from_etcd(**etcd_view(live))
    # the deal order is a function of etcd's marks: a requeued failure stays last
    assert_same(restored, live)
    assert list(restored.todo)[-1] == f1
    # the session at its cap is resent the same oldest task, same attempt
    assert restored.decide(session=S1, epoch=1, cap=2) == live.decide(session=S1, epoch=1, cap=2)
    # the others are offered the same todo task
    for session in (S2, S3):
        d = restored.decide(session=session, epoch=1, cap=2)
        assert d == live.decide(session=session, epoch=1, cap=2)
        assert d.outcome is Outcome.TASK and d.held is None


def test_restore_keeps_a_partly_failed_task_todo_and_a_past_limit_one_failed():
    h = Harness(num_tasks=4, max_failures=1, cap=4)
    a, _ = h.dispatch()
    h.fail(a)
    while True:
        task, _ = h.dispatch()
        if task == a:
            break
        h.finish(task)
    h.fail(a)
    assert h.state.status[a] == TaskStatus.FAILED
    assert_same(from_etcd(**etcd_view(h.state)), h.state)


def test_restore_holds_a_sessions_tasks_oldest_first_whatever_the_key_order():
    h = Harness(num_tasks=10, cap=2)
    first, second = 7, 3
    h.apply(TaskReserved(first, S1))
    a_first = h.assign(first, S1)
    h.apply(TaskReserved(second, S1))
    h.assign(second, S1)
    live = h.state
    restored = from_etcd(**etcd_view(live))   # assignments in task-id (key) order
    assert restored.held_by(S1) == [first, second]
    d = restored.decide(session=S1, epoch=0, cap=2)
    assert (d.task, d.held) == (first, a_first)


def test_restore_of_a_finished_job_answers_job_done():
    h = Harness(num_tasks=3, num_epochs=1)
    h.finish_epoch()
    restored = from_etcd(**etcd_view(h.state))
    assert_same(restored, h.state)
    assert restored.decide(session=S1, epoch=0, cap=2).outcome is Outcome.JOB_DONE


def test_restore_of_a_failed_job_reproduces_the_failed_epoch():
    h = Harness(num_tasks=3, num_epochs=2, max_failures=0, cap=3)
    for _ in range(3):
        task, _ = h.dispatch()
        h.fail(task)
    h.apply(JobFailed(0))
    restored = from_etcd(**etcd_view(h.state))
    assert_same(restored, h.state)
    assert restored.phase is Phase.FAILED
    assert restored.decide(session=S1, epoch=0, cap=2).outcome is Outcome.ALL_TASKS_FAILED


def test_restore_ignores_an_assignment_of_a_task_already_done():
    live = JobState.new(num_tasks=3, num_epochs=1, seed=0, max_failures=3)
    restored = from_etcd(
        num_tasks=3, num_epochs=1, seed=0, max_failures=3, epoch=0, failed_job=False,
        done=[1], failures={}, assignments={1: Assignment(S1, "t", 5, 0.0)})
    check(restored)
    assert restored.status[1] == TaskStatus.DONE
    assert restored.pending == {} and restored.held == {}
    assert list(restored.todo) == [t for t in live.todo if t != 1]


def test_restore_clamps_a_huge_failure_count():
    restored = from_etcd(
        num_tasks=2, num_epochs=1, seed=0, max_failures=3, epoch=0, failed_job=False,
        done=[], failures={0: 10**6}, assignments={})
    check(restored)
    assert restored.failures[0] == 0xFFFF
    assert restored.status[0] == TaskStatus.FAILED


# ---- live_assignment ------------------------------------------------------------------


def test_live_assignment_matches_only_the_current_epoch_task_and_attempt():
    h = Harness(num_tasks=3, num_epochs=3)
    task, a = h.dispatch()
    s = h.state
    assert s.live_assignment(task, 0, a.attempt) == a
    assert s.live_assignment(task, 1, a.attempt) is None
    assert s.live_assignment(task, 0, a.attempt + 1) is None
    assert s.live_assignment(-1, 0, a.attempt) is None
    assert s.live_assignment(3, 0, a.attempt) is None
    other = next(t for t in range(3) if t != task)
    assert s.live_assignment(other, 0, a.attempt) is None


# ---- random walks ---------------------------------------------------------------------


SESSIONS = (S1, S2, S3)


def is_legal(s: JobState, event) -> bool:
    """The rules of the life cycle, stated independently of JobState's code."""
    task = getattr(event, "task", None)
    status = s.status[task] if task is not None and 0 <= task < s.num_tasks else None
    pending = s.pending.get(task)
    match event:
        case TaskReserved():
            return status == TaskStatus.TODO and not s.job_over
        case ReservationCancelled():
            return status == TaskStatus.RESERVED
        case TaskAssigned(assignment=a):
            return status == TaskStatus.RESERVED and s.reserved[task] == a.session
        case TaskFinished(attempt=n) | TaskFailed(attempt=n) | TaskReleased(attempt=n):
            return status == TaskStatus.PENDING and pending.attempt == n
        case EpochAdvanced(epoch=e):
            busy = s.counts[TaskStatus.TODO] + s.counts[TaskStatus.RESERVED] + s.counts[TaskStatus.PENDING]
            return e == s.epoch + 1 and not s.job_over and busy == 0
        case JobFailed(epoch=e):
            return e == s.epoch and not s.job_over and s.counts[TaskStatus.FAILED] == s.num_tasks
        case EpochRestarted(epoch=e):
            return 0 <= e < s.num_epochs
    raise AssertionError(event)


class JobMachine(RuleBasedStateMachine):
    """Random sequences of legal events over a few sessions, plus random illegal ones:
    every invariant holds after every step, an illegal event changes nothing, and
    etcd's view of the state restores to the same state."""

    def __init__(self) -> None:
        super().__init__()
        self.state: JobState
        self.cap = 2
        self.attempt = 0

    @initialize(num_tasks=st.integers(1, 5), num_epochs=st.integers(1, 3), seed=st.integers(0, 3),
                max_failures=st.integers(0, 2), cap=st.integers(1, 3))
    def start(self, num_tasks, num_epochs, seed, max_failures, cap):
        self.state = JobState.new(num_tasks=num_tasks, num_epochs=num_epochs, seed=seed,
                                  max_failures=max_failures)
        self.cap = cap

    def _running(self) -> bool:
        return not self.state.job_over

    def _get_task(self, session: int, releasing: bool) -> int | None:
        """decide() as GetTask calls it, checked against the outcomes table; reserves
        a task from todo when it says so, and returns it."""
        s = self.state
        held = s.held_by(session)
        # a finish of its oldest pending task being written (begun, not yet applied)
        rel = frozenset(t for t in held[:1] if t in s.pending) if releasing else frozenset()
        for t in rel:
            s.begin(TaskFinished(t, s.pending[t].attempt))
        d = s.decide(session=session, epoch=s.epoch, cap=self.cap)
        for t in rel:
            s.abandon(TaskFinished(t, s.pending[t].attempt))
        assert d.outcome in (Outcome.TASK, Outcome.WAIT)
        live = [t for t in held if t not in rel]
        if d.outcome is Outcome.WAIT:
            # waits only with nothing to resend and nothing it may take
            assert not any(t in s.pending for t in live)
            assert not s.todo or len(live) >= self.cap
            return None
        if d.held is not None:
            assert d.task in live and s.pending[d.task] == d.held
            assert d.task == next(t for t in live if t in s.pending), "the oldest pending"
            return None
        assert d.task == s.todo[0] and len(live) < self.cap
        s.apply(TaskReserved(d.task, session))
        return d.task

    @precondition(_running)
    @rule(session=st.sampled_from(SESSIONS), releasing=st.booleans())
    def get_task(self, session, releasing):
        self._get_task(session, releasing)

    @precondition(_running)
    @rule(session=st.sampled_from(SESSIONS))
    def get_task_and_assign(self, session):
        task = self._get_task(session, False)
        if task is not None:
            self.attempt += 1
            self.state.apply(TaskAssigned(task, Assignment(session, "t", self.attempt, 0.0)))

    @precondition(lambda self: self._running() and self.state.reserved)
    @rule(data=st.data(), cancel=st.booleans())
    def complete_dispatch(self, data, cancel):
        s = self.state
        task = data.draw(st.sampled_from(sorted(s.reserved)))
        if cancel:
            s.apply(ReservationCancelled(task))
            assert task in s.todo and list(s.todo) == deal_order(s)
        else:
            self.attempt += 1
            session = s.reserved[task]
            s.apply(TaskAssigned(task, Assignment(session, "t", self.attempt, 0.0)))

    @precondition(lambda self: self._running() and self.state.pending)
    @rule(data=st.data(), how=st.sampled_from(["finish", "finish", "finish", "failure",
                                               "deadline", *RELEASE_CAUSES]))
    def report(self, data, how):
        s = self.state
        task = data.draw(st.sampled_from(sorted(s.pending)))
        attempt = s.pending[task].attempt
        before = s.failures[task]
        if how == "finish":
            s.apply(TaskFinished(task, attempt))
            assert s.status[task] == TaskStatus.DONE
        elif how in FAIL_CAUSES:
            self.attempt += 1  # the failure's revision: later than every earlier one
            s.apply(TaskFailed(task, attempt, how, self.attempt))
            assert s.failures[task] == before + 1
            if s.status[task] == TaskStatus.TODO:
                assert s.todo[-1] == task
            else:
                assert s.status[task] == TaskStatus.FAILED
        else:
            s.apply(TaskReleased(task, attempt, how))
            assert s.failures[task] == before and task in s.todo
            assert list(s.todo) == deal_order(s)

    @precondition(lambda self: self.state.epoch_complete)
    @rule()
    def end_epoch(self):
        s = self.state
        if s.all_failed:
            s.apply(JobFailed(s.epoch))
            assert s.phase is Phase.FAILED
        else:
            epoch = s.epoch
            s.apply(EpochAdvanced(epoch + 1))
            assert s.epoch == epoch + 1

    @rule(data=st.data(), dice=st.integers(0, 7))
    def restart(self, data, dice):
        if dice:  # rare: a restart undoes the progress that reaches the job's end
            return
        epoch = data.draw(st.integers(0, self.state.num_epochs - 1))
        self.state.apply(EpochRestarted(epoch))
        assert self.state.epoch == epoch
        assert self.state.counts[TaskStatus.TODO] == self.state.num_tasks

    @rule(data=st.data(), kind=st.sampled_from(["reserve", "cancel", "assign", "finish", "fail",
                                               "release", "advance", "jobfailed", "restart"]),
          session=st.sampled_from(SESSIONS))
    def arbitrary_event(self, data, kind, session):
        """Any event at all, aimed mostly at tasks in play: it applies, or raises
        InvalidTransition and changes nothing."""
        s = self.state
        in_play = sorted({*s.reserved, *s.pending, *list(s.todo)[:2], *range(s.num_tasks)[:1]})
        task = data.draw(st.sampled_from(in_play) | st.integers(-1, s.num_tasks))
        live = s.pending[task].attempt if task in s.pending else self.attempt
        attempt = data.draw(st.sampled_from([live, live - 1, live + 1, 0]))
        epoch = data.draw(st.sampled_from([s.epoch - 1, s.epoch, s.epoch + 1, s.num_epochs, -1]))
        if kind == "assign":
            self.attempt += 1  # a fresh attempt each time, as etcd's revision would be
            attempt = self.attempt
        event = {
            "reserve": TaskReserved(task, session),
            "cancel": ReservationCancelled(task),
            "assign": TaskAssigned(task, Assignment(session, "t", attempt, 0.0)),
            "finish": TaskFinished(task, attempt),
            "fail": TaskFailed(task, attempt, "failure"),
            "release": TaskReleased(task, attempt, "return"),
            "advance": EpochAdvanced(epoch),
            "jobfailed": JobFailed(epoch),
            "restart": EpochRestarted(epoch),
        }[kind]
        legal = is_legal(s, event)
        before = None if legal else copy.deepcopy(s)
        try:
            s.apply(event)
        except InvalidTransition:
            assert not legal, f"{event} refused in a state that allows it"
            assert s == before
            assert held_in_order(s) == held_in_order(before)
        else:
            assert legal, f"{event} applied in a state that forbids it"

    @invariant()
    def structure_holds(self):
        check(self.state)

    @invariant()
    def etcd_view_restores_the_same_state(self):
        s = self.state
        if s.reserved:
            return  # a reservation is not in etcd yet
        restored = from_etcd(**etcd_view(s))
        check(restored)
        assert statuses(restored) == statuses(s)
        assert restored.counts == s.counts
        assert restored.pending == s.pending
        assert list(restored.failures) == list(s.failures)
        assert restored.phase is s.phase
        assert {k: set(v) for k, v in restored.held.items()} == {k: set(v) for k, v in s.held.items()}
        assert list(restored.todo) == list(s.todo)  # the deal order too
        assert restored == s


JobMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=40, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_random_walks_keep_the_invariants = JobMachine.TestCase


# A plain seeded random walk: thousands of weighted steps in a fraction of a second,
# biased towards progress so that walks reach the ends of epochs and of jobs (which
# the stateful test above reaches less often).


def random_event(s: JobState, rng: random.Random, attempts: itertools.count):
    """Mostly a legal event, sometimes an arbitrary one."""
    legal = []
    if not s.job_over:
        for session in SESSIONS:
            d = s.decide(session=session, epoch=s.epoch, cap=2)
            if d.outcome is Outcome.TASK and d.held is None:
                legal += [TaskReserved(d.task, session)] * 3
    for task, session in s.reserved.items():
        legal += [TaskAssigned(task, Assignment(session, "t", next(attempts), 0.0))] * 4
        legal.append(ReservationCancelled(task))
    for task, a in s.pending.items():
        legal += [TaskFinished(task, a.attempt)] * 3
        legal += [TaskFailed(task, a.attempt, rng.choice(FAIL_CAUSES))] * 2
        legal.append(TaskReleased(task, a.attempt, rng.choice(RELEASE_CAUSES)))
    if s.epoch_complete:
        legal += [JobFailed(s.epoch) if s.all_failed else EpochAdvanced(s.epoch + 1)] * 10
    if legal and rng.random() < 0.85:
        return rng.choice(legal)
    task = rng.choice([*s.reserved, *s.pending, *range(-1, s.num_tasks + 1)])
    live = s.pending[task].attempt if task in s.pending else 0
    attempt = rng.choice([live, live - 1, live + 1])
    epoch = rng.choice([s.epoch - 1, s.epoch, s.epoch + 1, s.num_epochs])
    session = rng.choice(SESSIONS)
    return rng.choice([
        TaskReserved(task, session), ReservationCancelled(task),
        TaskAssigned(task, Assignment(session, "t", next(attempts), 0.0)),
        TaskFinished(task, attempt), TaskFailed(task, attempt, "failure"),
        TaskReleased(task, attempt, "leave"), EpochAdvanced(epoch), JobFailed(epoch),
        EpochRestarted(epoch) if rng.random() < 0.2 else EpochAdvanced(epoch),
    ])


def test_seeded_random_walks_keep_the_invariants_and_reach_the_end_of_jobs():
    ends = {Phase.SUCCEEDED: 0, Phase.FAILED: 0}
    for seed in range(80):
        rng = random.Random(seed)
        s = JobState.new(num_tasks=rng.randint(1, 6), num_epochs=rng.randint(1, 3),
                         seed=seed, max_failures=rng.randint(0, 1))
        attempts = itertools.count(1)
        log = []
        for _ in range(80):
            event = random_event(s, rng, attempts)
            log.append(event)
            legal = is_legal(s, event)
            before = None if legal else copy.deepcopy(s)
            try:
                s.apply(event)
            except InvalidTransition:
                assert not legal, f"seed {seed}: {event} refused; events: {log}"
                assert s == before and held_in_order(s) == held_in_order(before), f"seed {seed}: {log}"
            else:
                assert legal, f"seed {seed}: {event} applied; events: {log}"
            check(s)
            if not s.reserved:
                restored = from_etcd(**etcd_view(s))
                assert statuses(restored) == statuses(s), f"seed {seed}: {log}"
                assert restored.pending == s.pending and restored.phase is s.phase
                assert list(restored.failures) == list(s.failures)
                assert list(restored.todo) == list(s.todo), f"seed {seed}: {log}"
            if s.job_over:
                ends[s.phase] += 1
                break
    # the walks are long enough to finish jobs both ways
    assert ends[Phase.SUCCEEDED] >= 20 and ends[Phase.FAILED] >= 4, ends


# ---- writes in flight ---------------------------------------------------------------------


def test_a_task_being_written_is_no_live_assignment_and_a_second_write_is_refused():
    h = Harness(num_tasks=3)
    task, a = h.dispatch()
    finish = TaskFinished(task, a.attempt)
    h.state.begin(finish)
    assert h.state.writing(task)
    assert h.state.live_assignment(task, 0, a.attempt) is None
    before = copy.deepcopy(h.state)
    with pytest.raises(InvalidTransition):
        h.state.begin(TaskFailed(task, a.attempt, "failure"))
    assert h.state == before
    h.apply(finish)
    assert not h.state.writing(task) and h.state.status[task] == TaskStatus.DONE


def test_an_abandoned_write_leaves_the_task_live_as_before():
    h = Harness(num_tasks=3)
    task, a = h.dispatch()
    before = copy.deepcopy(h.state)
    release = TaskReleased(task, a.attempt, "return")
    h.state.begin(release)
    h.state.abandon(release)
    assert h.state == before
    assert h.state.live_assignment(task, 0, a.attempt) == a


def test_beginning_a_write_on_a_stale_attempt_is_refused_and_changes_nothing():
    h = Harness(num_tasks=3)
    task, a = h.dispatch()
    before = copy.deepcopy(h.state)
    with pytest.raises(InvalidTransition):
        h.state.begin(TaskFinished(task, a.attempt + 1))
    assert h.state == before


def test_a_dispatch_in_flight_is_a_reservation_and_its_abandon_a_cancellation():
    h = Harness(num_tasks=3)
    first = h.state.todo[0]
    assigned = TaskAssigned(first, Assignment(S1, "t", 0, 0.0))
    h.state.begin(assigned)
    assert h.state.reserved == {first: S1}
    h.state.abandon(assigned)
    assert h.state.reserved == {} and h.state.todo[0] == first
    check(h.state)


def test_tasks_being_written_pass_no_deadline():
    h = Harness(num_tasks=3)
    task, a = h.dispatch(deadline=5.0)
    assert [t for t, _ in h.state.expired(10.0)] == [task]
    h.state.begin(TaskFailed(task, a.attempt, "deadline"))
    assert list(h.state.expired(10.0)) == []


def test_the_end_of_an_epoch_is_in_flight_once():
    h = Harness(num_tasks=1, num_epochs=2)
    task, _ = h.dispatch()
    h.finish(task)
    advance = EpochAdvanced(1)
    h.state.begin(advance)
    assert h.state.epoch_ending
    with pytest.raises(InvalidTransition):
        h.state.begin(EpochAdvanced(1))
    h.apply(advance)
    assert h.state.epoch == 1 and not h.state.epoch_ending


def test_outside_readers_get_read_only_views():
    h = Harness(num_tasks=3)
    task, _ = h.dispatch()
    with pytest.raises(TypeError):
        h.state.pending[task] = None
    with pytest.raises(TypeError):
        h.state.status[task] = TaskStatus.DONE
    with pytest.raises(AttributeError):
        h.state.epoch = 5
    h.state.counts[TaskStatus.TODO] = 99
    assert h.state.counts[TaskStatus.TODO] == 2
