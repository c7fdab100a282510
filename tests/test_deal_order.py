"""The lazy deal order (master.partition.DealQueue inside JobState): every task dealt
exactly once per epoch, whatever was restored, released or failed on the way."""

from __future__ import annotations

import pytest

from master.partition import task_order
from master.state import (
    Assignment,
    JobState,
    Outcome,
    TaskAssigned,
    TaskFailed,
    TaskFinished,
    TaskReleased,
    TaskReserved,
)
from tests.test_state import from_etcd

pytestmark = pytest.mark.unit

S1, S2 = 0x51, 0x52


def deal_all(state: JobState, session: int) -> list[int]:
    """Deals and finishes every task left, one at a time, in the order the state offers them."""
    dealt, attempt = [], 1000
    while True:
        decision = state.decide(session=session, epoch=state.epoch, cap=1)
        if decision.outcome is not Outcome.TASK:
            return dealt
        attempt += 1
        state.apply(TaskReserved(decision.task, session))
        state.apply(TaskAssigned(decision.task, Assignment(session, "t", attempt, 0.0)))
        state.apply(TaskFinished(decision.task, attempt))
        dealt.append(decision.task)


def test_a_restored_pending_task_released_later_is_dealt_once():
    order = list(task_order(40, seed=3, epoch=0))
    late = order[-1]  # its position in the permutation still lies ahead of the cursor
    state = from_etcd(num_tasks=40, num_epochs=1, seed=3, max_failures=3, epoch=0,
                      failed_job=False, done=order[:5],
                      failures={}, assignments={late: Assignment(S2, "t2", 7, 0.0)})
    state.apply(TaskReleased(late, 7, "expiry"))
    assert state.todo[-1] == late  # back at its own place in the permutation
    dealt = deal_all(state, S1)
    assert dealt == order[5:]


def test_a_task_dealt_from_the_middle_fails_back_to_the_end_and_is_dealt_once_more():
    state = JobState.new(num_tasks=30, num_epochs=1, seed=1, max_failures=3)
    order = list(task_order(30, seed=1, epoch=0))
    middle = order[10]
    state.apply(TaskReserved(middle, S2))
    state.apply(TaskAssigned(middle, Assignment(S2, "t2", 1, 0.0)))
    state.apply(TaskFailed(middle, 1, "failure"))
    assert state.todo[-1] == middle
    dealt = deal_all(state, S1)
    assert dealt == [t for t in order if t != middle] + [middle]


def test_ten_million_tasks_start_without_a_list_of_them():
    state = JobState.new(num_tasks=10_000_000, num_epochs=2, seed=9, max_failures=3)
    first = state.decide(session=S1, epoch=0, cap=2).task
    assert first == task_order(10_000_000, seed=9, epoch=0)[0]


def test_a_restore_late_in_the_epoch_deals_what_is_left_in_the_permutation_order():
    order = list(task_order(100, seed=4, epoch=0))
    done = order[:90]  # late: fewer than a quarter left, the state lists them at once
    state = from_etcd(num_tasks=100, num_epochs=1, seed=4, max_failures=3, epoch=0,
                      failed_job=False, done=done[5:] + done[:5], failures={}, assignments={})
    assert list(state.todo) == order[90:]
    assert deal_all(state, S1) == order[90:]


def test_the_position_of_a_task_inverts_the_order():
    order = task_order(1025, seed=8, epoch=2)
    assert [order.index(order[i]) for i in range(1025)] == list(range(1025))
