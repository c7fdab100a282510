"""The tasks room: GetTask, the reports (finished, failed, returned), and task deadlines.

Each call decides from the cached `JobState` and commits its events through the
core (`Core.commit`: the write durably, then the cache). The writes of one GetTask
(the finishes it carries and the next dispatch) are queued together, so they ride
one group-commit batch. A task with a write in flight is marked so in the state:
any other report on it is STALE meanwhile (it is being changed already).

What this does NOT do: count a report done from the cache's word alone; only etcd's
compare on the live assignment does (invariant 2).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field

from master import metrics
from master.core import Core, InvalidArgument
from master.partition import ChunkRange
from master.sessions import SessionExpired, SessionSuperseded
from master.state import (
    Assignment,
    JobState,
    Outcome,
    TaskAssigned,
    TaskFailed,
    TaskFinished,
    TaskReleased,
)
from master.stealing import Stealing, unit_chunks
from master.trainers import Trainers

logger = logging.getLogger(__name__)

WAIT_RETRY = 0.5          # seconds a trainer is told to wait when nothing is free
EPOCH_END_RETRY = 0.05    # ... when the epoch is complete and its end is being written
DISPATCH_RETRY = 0.05     # ... when etcd refused a dispatch the cache thought valid
NO_DATASET_RETRY = 1.0
# A GetTask's `finished` refs, per task a session may hold: a session holds at most
# --max-tasks-per-trainer tasks, so an honest call carries no more than that (a few more
# after a retry of lost acks); an unbounded list would cost the master as long as the
# caller liked on every call.
FINISHED_PER_TASK_HELD = 8


# The per-call values below are slotted, not frozen: a frozen dataclass sets each field through
# object.__setattr__ (about three times as slow), and a GetTask makes a dozen.
# Nothing changes them once made.


@dataclass(slots=True)
class TaskRef:
    task: int
    epoch: int
    attempt: int


@dataclass(slots=True)
class TaskView:
    task: int
    epoch: int
    attempt: int
    chunks: list[ChunkRange]
    format: str


@dataclass(slots=True)
class GetTaskResult:
    outcome: Outcome
    current_epoch: int
    task: TaskView | None = None
    retry_after: float = 0.0
    finished_results: list[bool] = field(default_factory=list)
    more_tasks: list[TaskView] = field(default_factory=list)  # dealt besides `task` (max_tasks > 1)
    split_poll: float = 0.0  # work stealing: KeepAlive this often while holding the epoch's tail


class Tasks:
    def __init__(self, core: Core, trainers: Trainers, stealing: Stealing | None = None) -> None:
        self.core = core
        self.trainers = trainers
        # told of a session that asked in vain at the epoch's end; says how often a holder of
        # the epoch's last tasks should call (work stealing: master.stealing)
        self.stealing = stealing

    def check_finished_count(self, count: int) -> None:
        """Refuses a GetTask carrying more `finished` refs than a session could owe, before any
        work on them."""
        held = self.core.policy.max_tasks_per_trainer
        cap = FINISHED_PER_TASK_HELD * held
        if count > cap:
            raise InvalidArgument(f"{count} finished task refs in one GetTask: at most {cap} "
                                  f"({FINISHED_PER_TASK_HELD} x --max-tasks-per-trainer {held}; "
                                  f"a session holds at most {held} tasks)")

    async def get_task(self, session: int, epoch: int, finished: list[TaskRef],
                       max_tasks: int = 1) -> GetTaskResult:
        """The next task (up to `max_tasks` new ones for a prefetching trainer, never past the
        per-trainer cap), after the finishes it carries."""
        if epoch < 0:
            raise InvalidArgument(f"epoch {epoch} is negative: epochs count from 0")
        self.check_finished_count(len(finished))
        core = self.core
        async with core.admitted():
            info = await self.trainers.touch(session)
            state = core.state
            if state is None:
                return GetTaskResult(Outcome.WAIT, 0, retry_after=NO_DATASET_RETRY,
                                     finished_results=[False] * len(finished))
            finishing = [self._finish(state, session, ref) for ref in finished]
            dispatches: list[tuple[int, Awaitable[int | None]]] = []
            results: list[bool] = []
            awaited = 0  # finishing writes awaited so far (one that raised included)
            try:
                cap = core.policy.max_tasks_per_trainer
                decision = state.decide(session=session, epoch=epoch, cap=cap)
                if decision.outcome is Outcome.TASK and decision.held is None:
                    deadline = time.time() + core.policy.task_timeout if core.policy.task_timeout else 0.0
                    assignment = Assignment(session, info.trainer, 0, deadline)
                    task = decision.task
                    while True:  # each reservation is in the state at once: the next decide sees it
                        dispatches.append((task, core.commit(TaskAssigned(task, assignment))))
                        if len(dispatches) >= max_tasks:
                            break
                        more = state.decide(session=session, epoch=epoch, cap=cap)
                        if more.outcome is not Outcome.TASK or more.held is not None:
                            break
                        task = more.task
                for finish in finishing:
                    awaited += 1
                    results.append(await finish if finish is not None else False)
            except BaseException:
                # settle every write already queued (the caller retries); their outcome is etcd's
                for pending in [*finishing[awaited:], *(d for _, d in dispatches)]:
                    if pending is not None:
                        with contextlib.suppress(BaseException):
                            await pending
                raise
            if decision.outcome is not Outcome.TASK:
                retry = 0.0
                if decision.outcome is Outcome.WAIT:
                    # The epoch's end is being written: the next epoch is a moment away.
                    retry = EPOCH_END_RETRY if state.epoch_complete else WAIT_RETRY
                    if self.stealing is not None and epoch == state.epoch:
                        self.stealing.idle(session, state)
                return GetTaskResult(decision.outcome, state.epoch, retry_after=retry,
                                     finished_results=results, split_poll=self._split_poll(state, epoch))
            if decision.held is not None:
                views = [self._view(decision.task, state.epoch, decision.held.attempt)]
            else:
                views = [self._view(task, state.epoch, attempt)
                         for task, attempt in await self._dispatched(state, session, dispatches)]
                if not views:
                    return GetTaskResult(Outcome.WAIT, state.epoch, retry_after=DISPATCH_RETRY,
                                         finished_results=results)
            return GetTaskResult(Outcome.TASK, state.epoch, task=views[0], more_tasks=views[1:],
                                 finished_results=results, split_poll=self._split_poll(state, epoch))

    def _split_poll(self, state: JobState, epoch: int) -> float:
        return self.stealing.split_poll(state) if self.stealing is not None and epoch == state.epoch else 0.0

    def _view(self, task: int, epoch: int, attempt: int) -> TaskView:
        core = self.core
        assert core.partition is not None and core.spec is not None
        return TaskView(task, epoch, attempt, unit_chunks(core.partition, core.state, task), core.spec.format)

    async def _dispatched(self, state: JobState, session: int,
                          dispatches: list[tuple[int, Awaitable[int | None]]]) -> list[tuple[int, int]]:
        """(task, attempt) of each dispatch etcd took; none when the cache moved meanwhile."""
        taken: list[tuple[int, int]] = []
        refused = False
        error: BaseException | None = None
        for task, dispatch in dispatches:  # every write awaited, whatever happens to one
            try:
                attempt = await dispatch
            except BaseException as raised:  # noqa: BLE001  (re-raised once all are settled)
                error = error or raised
                continue
            if attempt is None:
                refused = True
            else:
                taken.append((task, attempt))
        if error is not None:
            raise error
        if self.core.state is not state:
            return []
        if refused and not taken:
            # The session's key or the epoch moved under us: the session is gone, or the cache is stale.
            if session in self.core.sessions.by_session:
                logger.warning("etcd refused every task dealt to live session %d (tasks %s): "
                               "the cache is out of step; rebuilding it from etcd",
                               session, [task for task, _ in dispatches])
                self.core.schedule_rebuild()
                return []
            raise SessionExpired(session)
        metrics.DISPATCHES.inc(len(taken))
        return taken

    def _finish(self, state: JobState, session: int, ref: TaskRef) -> Awaitable[bool] | None:
        """Queues the finish when `ref` is this session's live assignment; else None (STALE)."""
        if not self._is_live(state, session, ref):
            metrics.STALE_REPORTS.labels("finished").inc()
            return None
        return self._finished(self.core.commit(TaskFinished(ref.task, ref.attempt)))

    @staticmethod
    async def _finished(write: Awaitable[int | None]) -> bool:
        accepted = await write is not None  # a refusal is the core's to explain (`Core._refused`)
        (metrics.FINISHES if accepted else metrics.STALE_REPORTS.labels("finished")).inc()
        return accepted

    async def _report_state(self, session: int) -> JobState | None:
        """Reports are never errors for staleness: an unknown session's report is STALE."""
        try:
            await self.trainers.touch(session)
        except (SessionExpired, SessionSuperseded):
            return None
        return self.core.state

    @staticmethod
    def _is_live(state: JobState, session: int, ref: TaskRef) -> bool:
        assignment = state.live_assignment(ref.task, ref.epoch, ref.attempt)
        return assignment is not None and assignment.session == session

    async def task_finished(self, session: int, ref: TaskRef) -> bool:
        async with self.core.admitted():
            state = await self._report_state(session)
            if state is None:
                return False
            finish = self._finish(state, session, ref)
            return await finish if finish is not None else False

    async def task_failed(self, session: int, ref: TaskRef, reason: str) -> bool:
        async with self.core.admitted():
            state = await self._report_state(session)
            if state is None or not self._is_live(state, session, ref):
                metrics.STALE_REPORTS.labels("failed").inc()
                return False
            logger.info("task %d (epoch %d, attempt %d) failed: %s", ref.task, ref.epoch, ref.attempt, reason)
            metrics.FAILURE_REASONS.record(ref.task, epoch=ref.epoch, attempt=ref.attempt, reason=reason,
                                           trainer=state.assignment(ref.task).trainer, at=time.time())
            return await self._fail(ref, cause="failure")

    async def return_task(self, session: int, ref: TaskRef) -> bool:
        async with self.core.admitted():
            state = await self._report_state(session)
            if state is None or not self._is_live(state, session, ref):
                metrics.STALE_REPORTS.labels("returned").inc()
                return False
            returned = await self.core.commit(TaskReleased(ref.task, ref.attempt, "return")) is not None
            if returned:
                self.core.count_requeue("return")
            return returned

    async def _fail(self, ref: TaskRef, *, cause: str) -> bool:
        if await self.core.commit(TaskFailed(ref.task, ref.attempt, cause)) is None:
            return False
        self.core.count_requeue(cause)
        return True

    # ---- deadlines --------------------------------------------------------------------

    async def deadline_loop(self) -> None:
        """Fails the tasks past their deadline (`--task-timeout`): a live but stuck trainer."""
        timeout = self.core.policy.task_timeout
        if not timeout:
            return
        period = min(1.0, timeout / 4)
        while True:
            await asyncio.sleep(period)
            state = self.core.state
            if state is None or not self.core.serving:
                continue
            for task, assignment in list(state.expired(time.time())):
                logger.info("task %d passed its deadline (trainer %s)", task, assignment.trainer)
                ref = TaskRef(task, state.epoch, assignment.attempt)
                self.core.spawn(self.core.guarded(self._deadline_passed(state, ref)), f"deadline-{task}")

    async def _deadline_passed(self, state: JobState, ref: TaskRef) -> None:
        if self.core.state is state and state.live_assignment(ref.task, ref.epoch, ref.attempt) is not None:
            await self._fail(ref, cause="deadline")
