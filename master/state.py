"""The task state machine of one job: pure, no I/O, no clock, no gRPC.

Every change is a named event applied by `JobState.apply` (the tf.data service
dispatcher's `Apply(update)` shape). The dispatcher applies an event only after
etcd has durably accepted the write that stands for it, so this object always
mirrors etcd; after a restart `JobState.restore` rebuilds it from what etcd holds.

Life cycle of a task within an epoch (DESIGN.md section 5):

    todo --reserve--> reserved --assign--> pending --finish--> done
    reserved --cancel--> todo                  (the dispatch write failed)
    pending --fail (data or deadline)--> todo, or failed past max_task_failures
    pending --release (expiry, leave, supersede, return, restart)--> todo

`reserved` exists only while a dispatch write is in flight, so two concurrent
requests never pick the same task. The epoch ends when todo, reserved and pending
are all empty, whatever transition emptied them; the dispatcher then persists
`EpochAdvanced` (or `JobFailed` when every task of the epoch failed).
"""

from __future__ import annotations

import enum
from array import array
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from master.partition import task_order


class TaskStatus(enum.IntEnum):
    TODO = 0
    RESERVED = 1
    PENDING = 2
    DONE = 3
    FAILED = 4


class Outcome(enum.Enum):
    TASK = "TASK"
    WAIT = "WAIT"
    EPOCH_DONE = "EPOCH_DONE"
    JOB_DONE = "JOB_DONE"
    ALL_TASKS_FAILED = "ALL_TASKS_FAILED"


class Phase(str, enum.Enum):
    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class InvalidTransition(RuntimeError):
    """An event does not fit the current state: a bug, or a cache that must be rebuilt."""


@dataclass(frozen=True)
class Assignment:
    session: int
    trainer: str
    attempt: int
    deadline: float  # wall-clock seconds; 0 = none


# ---- events -------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskReserved:
    task: int
    session: int


@dataclass(frozen=True)
class ReservationCancelled:
    task: int


@dataclass(frozen=True)
class TaskAssigned:
    task: int
    assignment: Assignment


@dataclass(frozen=True)
class TaskFinished:
    task: int
    attempt: int


@dataclass(frozen=True)
class TaskFailed:
    task: int
    attempt: int
    cause: str  # "failure" | "deadline"


@dataclass(frozen=True)
class TaskReleased:
    task: int
    attempt: int
    cause: str  # "expiry" | "leave" | "superseded" | "return"


@dataclass(frozen=True)
class EpochAdvanced:
    epoch: int  # the new epoch


@dataclass(frozen=True)
class EpochRestarted:
    epoch: int


@dataclass(frozen=True)
class JobFailed:
    epoch: int


Event = (TaskReserved | ReservationCancelled | TaskAssigned | TaskFinished | TaskFailed
         | TaskReleased | EpochAdvanced | EpochRestarted | JobFailed)


@dataclass(frozen=True)
class Decision:
    """What `GetTask` should answer, before any write."""

    outcome: Outcome
    task: int | None = None          # with TASK: the task to reserve, or one already held
    held: Assignment | None = None   # with TASK: set when re-sending a task the session holds


# ---- the machine --------------------------------------------------------------------


@dataclass
class JobState:
    num_tasks: int
    num_epochs: int
    seed: int
    max_failures: int
    epoch: int = 0
    failed_job: bool = False
    status: bytearray = field(default_factory=bytearray)
    failures: array = field(default_factory=lambda: array("H"))
    todo: deque[int] = field(default_factory=deque)
    reserved: dict[int, int] = field(default_factory=dict)            # task -> session
    pending: dict[int, Assignment] = field(default_factory=dict)      # task -> assignment
    held: dict[int, dict[int, None]] = field(default_factory=dict)    # session -> tasks, oldest first
    counts: list[int] = field(default_factory=lambda: [0] * 5)       # by TaskStatus

    @classmethod
    def new(cls, *, num_tasks: int, num_epochs: int, seed: int, max_failures: int,
            epoch: int = 0) -> JobState:
        state = cls(num_tasks=num_tasks, num_epochs=num_epochs, seed=seed, max_failures=max_failures)
        state._begin_epoch(epoch)
        return state

    @classmethod
    def restore(cls, *, num_tasks: int, num_epochs: int, seed: int, max_failures: int,
                epoch: int, failed_job: bool, done: Iterable[int], failures: dict[int, int],
                assignments: dict[int, Assignment]) -> JobState:
        """Rebuilds the state from what etcd holds (the epoch's marks and live assignments)."""
        state = cls(num_tasks=num_tasks, num_epochs=num_epochs, seed=seed, max_failures=max_failures)
        state._begin_epoch(epoch)
        state.failed_job = failed_job
        if state.epoch >= num_epochs:
            return state  # a failed job keeps its epoch's marks: rebuild them below
        for task in done:
            state._set(task, TaskStatus.DONE)
        for task, count in failures.items():
            state.failures[task] = min(count, 0xFFFF)
            if count > max_failures and state.status[task] == TaskStatus.TODO:
                state._set(task, TaskStatus.FAILED)
        # oldest first, as the live path holds them (attempts are etcd revisions: they grow)
        for task, assignment in sorted(assignments.items(), key=lambda item: item[1].attempt):
            if state.status[task] == TaskStatus.TODO:
                state._set(task, TaskStatus.PENDING)
                state.pending[task] = assignment
                state.held.setdefault(assignment.session, {})[task] = None
        state.todo = deque(t for t in state.todo if state.status[t] == TaskStatus.TODO)
        return state

    # -- queries --

    @property
    def job_over(self) -> bool:
        return self.failed_job or self.epoch >= self.num_epochs

    @property
    def epoch_complete(self) -> bool:
        """True when no task is left to hand out or wait for: the epoch must end."""
        c = self.counts
        return not self.job_over and c[TaskStatus.TODO] == c[TaskStatus.RESERVED] == c[TaskStatus.PENDING] == 0

    @property
    def all_failed(self) -> bool:
        return self.counts[TaskStatus.FAILED] == self.num_tasks

    @property
    def phase(self) -> Phase:
        if self.failed_job:
            return Phase.FAILED
        return Phase.SUCCEEDED if self.epoch >= self.num_epochs else Phase.RUNNING

    def held_by(self, session: int) -> list[int]:
        return list(self.held.get(session, ()))

    def live_assignment(self, task: int, epoch: int, attempt: int) -> Assignment | None:
        """The assignment a report names, if it is still the live one."""
        if epoch != self.epoch or not 0 <= task < self.num_tasks:
            return None
        assignment = self.pending.get(task)
        return assignment if assignment is not None and assignment.attempt == attempt else None

    def decide(self, *, session: int, epoch: int, cap: int,
               releasing: frozenset[int] = frozenset()) -> Decision:
        """The outcomes table of DESIGN.md section 3 for a `GetTask` from a live session.

        `releasing` holds the session's tasks whose finish is being written right now:
        they neither count against the per-trainer cap nor are sent again.
        """
        if epoch < 0:
            raise ValueError(f"epoch {epoch} is negative")
        if self.failed_job:
            return Decision(Outcome.ALL_TASKS_FAILED)
        if self.job_over or epoch >= self.num_epochs:
            return Decision(Outcome.JOB_DONE)
        if epoch < self.epoch:
            return Decision(Outcome.EPOCH_DONE)
        if epoch > self.epoch:
            return Decision(Outcome.WAIT)
        held = [t for t in self.held.get(session, ()) if t not in releasing]
        if len(held) >= cap or (held and not self.todo):
            # At the cap, or nothing left to give: re-send the oldest task it holds, so an
            # assignment whose answer was lost is never stranded.
            for task in held:
                if task in self.pending:
                    return Decision(Outcome.TASK, task, self.pending[task])
            return Decision(Outcome.WAIT)
        if self.todo:
            return Decision(Outcome.TASK, self.todo[0])
        return Decision(Outcome.WAIT)

    def expired(self, now: float) -> Iterator[tuple[int, Assignment]]:
        for task, assignment in self.pending.items():
            if assignment.deadline and assignment.deadline <= now:
                yield task, assignment

    # -- transitions --

    def apply(self, event: Event) -> None:
        handler = getattr(self, f"_on_{type(event).__name__}")
        handler(event)

    def _on_TaskReserved(self, e: TaskReserved) -> None:
        self._expect(e.task, TaskStatus.TODO, e)
        self.todo.remove(e.task) if self.todo[0] != e.task else self.todo.popleft()
        self._set(e.task, TaskStatus.RESERVED)
        self.reserved[e.task] = e.session
        self.held.setdefault(e.session, {})[e.task] = None

    def _on_ReservationCancelled(self, e: ReservationCancelled) -> None:
        self._expect(e.task, TaskStatus.RESERVED, e)
        session = self.reserved.pop(e.task)
        self._unhold(session, e.task)
        self._requeue(e.task)

    def _on_TaskAssigned(self, e: TaskAssigned) -> None:
        self._expect(e.task, TaskStatus.RESERVED, e)
        session = self.reserved[e.task]
        if session != e.assignment.session:
            raise InvalidTransition(f"{e}: reserved for session {session:x}")
        del self.reserved[e.task]
        self._set(e.task, TaskStatus.PENDING)
        self.pending[e.task] = e.assignment

    def _on_TaskFinished(self, e: TaskFinished) -> None:
        assignment = self._take_pending(e.task, e.attempt, e)
        self._unhold(assignment.session, e.task)
        self._set(e.task, TaskStatus.DONE)

    def _on_TaskFailed(self, e: TaskFailed) -> None:
        assignment = self._take_pending(e.task, e.attempt, e)
        self._unhold(assignment.session, e.task)
        self.failures[e.task] = min(self.failures[e.task] + 1, 0xFFFF)
        if self.failures[e.task] > self.max_failures:
            self._set(e.task, TaskStatus.FAILED)
        else:
            self._requeue(e.task, front=False)

    def _on_TaskReleased(self, e: TaskReleased) -> None:
        assignment = self._take_pending(e.task, e.attempt, e)
        self._unhold(assignment.session, e.task)
        self._requeue(e.task)

    def _on_EpochAdvanced(self, e: EpochAdvanced) -> None:
        if e.epoch != self.epoch + 1 or not self.epoch_complete:
            raise InvalidTransition(f"{e}: epoch {self.epoch} is not complete")
        self._begin_epoch(e.epoch)

    def _on_EpochRestarted(self, e: EpochRestarted) -> None:
        if not 0 <= e.epoch < self.num_epochs:
            raise InvalidTransition(f"{e}: outside 0..{self.num_epochs - 1}")
        self.failed_job = False
        self._begin_epoch(e.epoch)

    def _on_JobFailed(self, e: JobFailed) -> None:
        if e.epoch != self.epoch or not (self.epoch_complete and self.all_failed):
            raise InvalidTransition(f"{e}: not every task of epoch {self.epoch} failed")
        self.failed_job = True

    # -- helpers --

    def _begin_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        over = epoch >= self.num_epochs
        self.status = bytearray([TaskStatus.DONE if over else TaskStatus.TODO]) * self.num_tasks
        self.failures = array("H", bytes(2 * self.num_tasks))
        self.reserved.clear()
        self.pending.clear()
        self.held.clear()
        if over:
            self.todo = deque()
            self.counts = [0, 0, 0, self.num_tasks, 0]
        else:
            self.todo = deque(task_order(self.num_tasks, seed=self.seed, epoch=epoch))
            self.counts = [self.num_tasks, 0, 0, 0, 0]

    def _set(self, task: int, status: TaskStatus) -> None:
        self.counts[self.status[task]] -= 1
        self.counts[status] += 1
        self.status[task] = status

    def _expect(self, task: int, status: TaskStatus, event: Event) -> None:
        if not 0 <= task < self.num_tasks or self.status[task] != status:
            actual = TaskStatus(self.status[task]).name if 0 <= task < self.num_tasks else "unknown"
            raise InvalidTransition(f"{event}: task is {actual}, expected {status.name}")

    def _take_pending(self, task: int, attempt: int, event: Event) -> Assignment:
        self._expect(task, TaskStatus.PENDING, event)
        assignment = self.pending[task]
        if assignment.attempt != attempt:
            raise InvalidTransition(f"{event}: live attempt is {assignment.attempt}")
        del self.pending[task]
        return assignment

    def _unhold(self, session: int, task: int) -> None:
        tasks = self.held.get(session)
        if tasks is not None:
            tasks.pop(task, None)
            if not tasks:
                del self.held[session]

    def _requeue(self, task: int, *, front: bool = True) -> None:
        """Back to todo. Returned tasks go first (they hold the epoch's end back);
        failed ones last, so a poisoned task does not crowd out healthy ones."""
        self._set(task, TaskStatus.TODO)
        (self.todo.appendleft if front else self.todo.append)(task)
