"""The task state machine of one job: pure, no I/O, no clock, no gRPC.

Every change is a named event applied by `JobState.apply` (the tf.data service
dispatcher's `Apply(update)` shape), dispatched by one exhaustive `match`. The
dispatcher applies a durable event only after etcd took the transaction that stands
for it (`master.transactions`), so this object always mirrors etcd; after a restart
the same `apply` rebuilds it from what etcd holds (`MarksLoaded` onto a state begun
at etcd's epoch), the deal order included: the order is a function of what etcd
holds (`master.partition.DealQueue`). This is the task part of the master's one
machine, `master.machine.MasterMachine`, which is the only caller of `apply`.

Life cycle of a task within an epoch (docs/design.md section 5):

    todo --reserve--> reserved --assign--> pending --finish--> done
    reserved --cancel--> todo                  (the dispatch write failed)
    pending --fail (data or deadline)--> todo, or failed past max_task_failures
    pending --release (expiry, leave, supersede, return, restart)--> todo
    pending --split--> pending (its data cut short) + a new piece in todo

Work stealing (docs/design.md section 5a, `master.stealing`): `TaskSplit` cuts the
unread rest off a pending task at a byte position its holder agreed to stop at; the
rest becomes a *piece*, a unit of this epoch with the next free id from `num_tasks`
up, dealt, finished, failed and released like a task. `extent(unit)` is the byte
range of its root task a unit owns; the pieces and the cut extents end with the epoch
(a restart of the epoch in progress keeps them: `EpochRestarted`).

A write in flight is a status of the machine, marked by `begin(event)` and ended by
`apply(event)` (etcd took it) or `abandon(event)` (it did not): a dispatch holds its
task `reserved`, so two concurrent requests never pick the same task; a finish,
failure or return marks its pending task as being written, so no other report on it
is accepted meanwhile; an epoch's end marks the epoch. The epoch ends when todo,
reserved and pending are all empty, whatever transition emptied them; the dispatcher
then commits `EpochAdvanced` (or `JobFailed` when every task of the epoch failed).

Outside this module the state is read only through the queries below (the
containers they return are read-only views or copies); nothing else mutates it.

Adding a transition touches the event (a dataclass here, in `Durable` if etcd must
hold it), its case in `apply` (and in `begin`/`abandon`, which say what its write in
flight marks), its transaction in `master.transactions`, and the room that commits
it; `typing.assert_never` makes a missed case a type error.
"""

from __future__ import annotations

import enum
import types
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import assert_never

from master.partition import DealQueue, task_order
from paddlecloud.phase import Phase


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
    assignment: Assignment  # attempt: 0 until etcd names it (the revision of the write)


@dataclass(frozen=True)
class TaskFinished:
    task: int
    attempt: int


@dataclass(frozen=True)
class TaskFailed:
    task: int
    attempt: int
    cause: str  # "failure" | "deadline"
    revision: int = 0  # etcd's revision of the write (`committed`): where the task queues


@dataclass(frozen=True)
class TaskReleased:
    task: int
    attempt: int
    cause: str  # "expiry" | "leave" | "superseded" | "evicted" | "return"


@dataclass(frozen=True)
class TaskSplit:
    """Pending `task` (live `attempt`) keeps bytes [lo, at) of its root task; [at, end)
    becomes the new todo unit `piece`."""

    task: int
    attempt: int
    root: int
    lo: int
    at: int
    end: int
    piece: int


@dataclass(frozen=True)
class EpochAdvanced:
    epoch: int  # the new epoch


@dataclass(frozen=True)
class EpochRestarted:
    epoch: int
    done: tuple[int, ...] = ()   # tasks the model already consumed in `epoch` (a checkpoint's)


@dataclass(frozen=True)
class JobFailed:
    epoch: int


@dataclass(frozen=True)
class MarksLoaded:
    """What etcd holds of the current epoch, applied to a state just begun at that epoch:
    how a cache rebuilt from etcd becomes the machine that ran (`master.machine.Loaded`)."""

    failed_job: bool = False
    done: Sequence[int] = ()
    failures: Mapping[int, int] = field(default_factory=dict)        # task -> failures this epoch
    failed_at: Mapping[int, int] = field(default_factory=dict)       # task -> revision of the last
    assignments: Mapping[int, Assignment] = field(default_factory=dict)  # of live sessions only
    extents: Mapping[int, tuple[int, int, int]] = field(default_factory=dict)  # unit -> its cut


# Events that stand for an etcd transaction (`master.transactions`); the others only
# mark a write in flight (a reservation), end one that failed, or load etcd's marks.
Durable = (TaskAssigned | TaskFinished | TaskFailed | TaskReleased | TaskSplit | EpochAdvanced
           | EpochRestarted | JobFailed)
Event = TaskReserved | ReservationCancelled | MarksLoaded | Durable


def committed(event: Durable, revision: int) -> Durable:
    """The event as etcd took it at `revision`: an assignment's attempt is that revision, and
    so is a failure's place in the deal order (the mod revision of its `failures/` key)."""
    if isinstance(event, TaskAssigned):
        a = event.assignment
        return TaskAssigned(event.task, Assignment(a.session, a.trainer, revision, a.deadline))
    if isinstance(event, TaskFailed):
        return TaskFailed(event.task, event.attempt, event.cause, revision)
    return event


@dataclass(slots=True)
class Decision:
    """What `GetTask` should answer, before any write (not frozen: see `master.tasks.TaskRef`)."""

    outcome: Outcome
    task: int | None = None          # with TASK: the task to reserve, or one already held
    held: Assignment | None = None   # with TASK: set when re-sending a task the session holds


# ---- the machine --------------------------------------------------------------------


def _read_only(slot: str, doc: str) -> property:
    return property(attrgetter(slot), doc=doc)


_TODO = int(TaskStatus.TODO)


class JobState:
    """One job's tasks in the current epoch; see the module docstring for the rules."""

    __slots__ = ("_num_tasks", "_num_epochs", "_seed", "_max_failures", "_epoch", "_failed_job",
                 "_status", "_failures", "_todo", "_reserved", "_pending", "_held", "_counts",
                 "_writing", "_ending", "_tasks_assigned", "_failed_at", "_extents")

    def __init__(self, *, num_tasks: int, num_epochs: int, seed: int, max_failures: int) -> None:
        self._num_tasks = num_tasks
        self._num_epochs = num_epochs
        self._seed = seed
        self._max_failures = max_failures
        self._epoch = 0
        self._failed_job = False
        self._status = bytearray()
        self._failures = array("H")
        self._todo = DealQueue(task_order(0, seed=seed, epoch=0), self._is_todo)
        self._reserved: dict[int, int] = {}              # task -> session
        self._pending: dict[int, Assignment] = {}        # task -> assignment
        self._held: dict[int, dict[int, None]] = {}      # session -> tasks, oldest first
        self._counts = [0] * 5                           # by TaskStatus
        self._writing: set[int] = set()                  # pending tasks with a write in flight
        self._ending = False                             # the epoch's end is being written
        self._tasks_assigned = False                     # a trainer ever took a task (see property)
        self._failed_at: dict[int, int] = {}             # task -> revision of its last failure
        self._extents: dict[int, tuple[int, int, int]] = {}  # unit -> (root, lo, hi), once cut

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JobState):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.__slots__
                   if name != "_tasks_assigned")  # a history, not the tasks' state

    __hash__ = None  # type: ignore[assignment]  (mutable)

    def __repr__(self) -> str:
        return (f"JobState(epoch={self._epoch}/{self._num_epochs}, tasks={self._num_tasks}, "
                f"counts={self._counts}, failed_job={self._failed_job})")

    @classmethod
    def new(cls, *, num_tasks: int, num_epochs: int, seed: int, max_failures: int,
            epoch: int = 0) -> JobState:
        state = cls(num_tasks=num_tasks, num_epochs=num_epochs, seed=seed, max_failures=max_failures)
        state._begin_epoch(epoch)
        return state

    def _deal_pieces(self) -> None:
        """The healthy pieces left to do back in the deal queue's front, where a split or a
        release puts them (`master.partition.DealQueue`: before every task, the newest
        first); a piece that failed in this epoch is queued with the failed tasks."""
        for piece in range(self._num_tasks, len(self._status)):
            if self._status[piece] == _TODO and not self._failures[piece]:
                self._todo.push_front(piece)

    def _add_pieces(self, extents: Mapping[int, tuple[int, int, int]]) -> None:
        """Restores the cut extents; the pieces among them (ids `num_tasks` up) are todo."""
        pieces = sorted(unit for unit in extents if unit >= self._num_tasks)
        if pieces != list(range(self._num_tasks, self._num_tasks + len(pieces))):
            raise IndexError(f"pieces {pieces[:5]} are not numbered from {self._num_tasks} on without a gap")
        self._extents.update(extents)
        for piece in pieces:
            self._add_unit(piece, deal=False)  # queued once its marks are in (`_deal_pieces`)

    # -- queries (read-only) --

    num_tasks = _read_only("_num_tasks", "Tasks per epoch.")
    num_epochs = _read_only("_num_epochs", "Epochs of the job.")
    seed = _read_only("_seed", "The shuffle seed of the deal order.")
    max_failures = _read_only("_max_failures", "Failures a task may have in an epoch before it ends failed.")
    epoch = _read_only("_epoch", "The current epoch.")
    failed_job = _read_only("_failed_job", "Every task of an epoch failed: the job failed.")

    @property
    def tasks_assigned(self) -> bool:
        """A trainer took a task of this job: since this state was made, or, for a state
        loaded from etcd (`MarksLoaded`), as its marks show (a later epoch, done or failed tasks, live
        assignments). False: no trainer used the master, the job brings its own data."""
        return self._tasks_assigned

    @property
    def status(self) -> memoryview:
        """Each task's `TaskStatus` value, by task id (read-only)."""
        return memoryview(self._status).toreadonly()

    @property
    def failures(self) -> memoryview:
        """Each task's failures in this epoch, by task id (read-only)."""
        return memoryview(self._failures).toreadonly()

    @property
    def failed_at(self) -> Mapping[int, int]:
        """task -> the etcd revision of its last failure in this epoch (where it queues)."""
        return types.MappingProxyType(self._failed_at)

    @property
    def counts(self) -> list[int]:
        """Tasks by `TaskStatus` (a copy)."""
        return list(self._counts)

    @property
    def todo(self) -> tuple[int, ...]:
        """The tasks left to deal, in order (a copy: for inspection and tests)."""
        return tuple(self._todo)

    @property
    def reserved(self) -> Mapping[int, int]:
        """task -> the session a dispatch write is in flight for."""
        return types.MappingProxyType(self._reserved)

    @property
    def pending(self) -> Mapping[int, Assignment]:
        """task -> its live assignment."""
        return types.MappingProxyType(self._pending)

    @property
    def held(self) -> dict[int, tuple[int, ...]]:
        """session -> the tasks it holds (reserved or pending), oldest first (a copy)."""
        return {session: tuple(tasks) for session, tasks in self._held.items()}

    @property
    def units(self) -> int:
        """Tasks and pieces of this epoch (the pieces' ids: `num_tasks` up to this)."""
        return len(self._status)

    @property
    def splits(self) -> int:
        """Splits in this epoch: each made one piece."""
        return len(self._status) - self._num_tasks

    def extent(self, unit: int) -> tuple[int, int, int] | None:
        """(root task, lo, hi): the bytes of its root task a unit owns, once a split cut it;
        None for a task no split touched (it owns the whole of itself)."""
        return self._extents.get(unit)

    @property
    def job_over(self) -> bool:
        return self._failed_job or self._epoch >= self._num_epochs

    @property
    def epoch_complete(self) -> bool:
        """True when no task is left to hand out or wait for: the epoch must end."""
        c = self._counts
        return not self.job_over and c[TaskStatus.TODO] == c[TaskStatus.RESERVED] == c[TaskStatus.PENDING] == 0

    @property
    def all_failed(self) -> bool:
        return self._counts[TaskStatus.FAILED] == len(self._status)

    @property
    def epoch_ending(self) -> bool:
        """The write that ends this epoch is in flight."""
        return self._ending

    @property
    def phase(self) -> Phase:
        if self._failed_job:
            return Phase.FAILED
        return Phase.SUCCEEDED if self._epoch >= self._num_epochs else Phase.RUNNING

    def held_by(self, session: int) -> list[int]:
        return list(self._held.get(session, ()))

    def assignment(self, task: int) -> Assignment | None:
        """The task's live assignment, if it is pending."""
        return self._pending.get(task)

    def writing(self, task: int) -> bool:
        """A write that ends the task's assignment (finish, failure, return) is in flight."""
        return task in self._writing

    def live_assignment(self, task: int, epoch: int, attempt: int) -> Assignment | None:
        """The assignment a report names, if it is still the live one and no write on it is in flight."""
        if epoch != self._epoch or not 0 <= task < len(self._status) or task in self._writing:
            return None
        assignment = self._pending.get(task)
        return assignment if assignment is not None and assignment.attempt == attempt else None

    def decide(self, *, session: int, epoch: int, cap: int) -> Decision:
        """The outcomes table of docs/design.md section 3 for a `GetTask` from a live session.

        The session's tasks whose finish, failure or return is being written neither
        count against the per-trainer cap nor are sent again.
        """
        if epoch < 0:
            raise ValueError(f"epoch {epoch} is negative")
        if self._failed_job:
            return Decision(Outcome.ALL_TASKS_FAILED)
        if self.job_over or epoch >= self._num_epochs:
            return Decision(Outcome.JOB_DONE)
        if epoch < self._epoch:
            return Decision(Outcome.EPOCH_DONE)
        if epoch > self._epoch:
            return Decision(Outcome.WAIT)
        writing = self._writing
        held = [t for t in self._held.get(session, ()) if t not in writing]
        head = self._todo.peek()
        if len(held) >= cap or (held and head is None):
            # At the cap, or nothing left to give: re-send the oldest task it holds, so an
            # assignment whose answer was lost is never stranded.
            for task in held:
                if task in self._pending:
                    return Decision(Outcome.TASK, task, self._pending[task])
            return Decision(Outcome.WAIT)
        if head is not None:
            return Decision(Outcome.TASK, head)
        return Decision(Outcome.WAIT)

    def expired(self, now: float) -> Iterator[tuple[int, Assignment]]:
        """Pending tasks past their deadline with no write in flight on them."""
        for task, assignment in self._pending.items():
            if assignment.deadline and assignment.deadline <= now and task not in self._writing:
                yield task, assignment

    # -- writes in flight --

    def begin(self, event: Durable) -> None:
        """Marks `event`'s write as in flight; `apply(event)` or `abandon(event)` ends it.

        Raises InvalidTransition, changing nothing, when the event could not apply now.
        """
        match event:
            case TaskAssigned(task=task, assignment=assignment):
                self.apply(TaskReserved(task, assignment.session))
            case TaskFinished(task=task, attempt=attempt) | TaskFailed(task=task, attempt=attempt) \
                    | TaskReleased(task=task, attempt=attempt) | TaskSplit(task=task, attempt=attempt):
                self._expect_live(task, attempt, event)
                if task in self._writing:
                    raise InvalidTransition(f"{event}: a write on task {task} is in flight already")
                self._writing.add(task)
            case EpochAdvanced() | JobFailed():
                if self._ending:
                    raise InvalidTransition(f"{event}: the end of epoch {self._epoch} is in flight already")
                self._ending = True
            case EpochRestarted():
                pass  # written with the gate closed: nothing else is in flight
            case _:
                assert_never(event)

    def abandon(self, event: Durable) -> None:
        """The write of `event` did not happen (refused, or its outcome unknown): unmark it."""
        match event:
            case TaskAssigned(task=task):
                if self._status[task] == TaskStatus.RESERVED:
                    self.apply(ReservationCancelled(task))
            case TaskFinished(task=task) | TaskFailed(task=task) | TaskReleased(task=task) \
                    | TaskSplit(task=task):
                self._writing.discard(task)
            case EpochAdvanced() | JobFailed():
                self._ending = False
            case EpochRestarted():
                pass
            case _:
                assert_never(event)

    # -- transitions --

    def apply(self, event: Event) -> None:
        """Applies one event, or raises InvalidTransition and changes nothing."""
        match event:
            case TaskReserved():
                self._reserve(event)
            case ReservationCancelled():
                self._cancel(event)
            case TaskAssigned():
                self._assign(event)
            case TaskFinished():
                self._finish(event)
            case TaskFailed():
                self._fail(event)
            case TaskReleased():
                self._release(event)
            case TaskSplit():
                self._split(event)
            case EpochAdvanced():
                self._advance(event)
            case EpochRestarted():
                self._restart(event)
            case JobFailed():
                self._fail_job(event)
            case MarksLoaded():
                self._load_marks(event)
            case _:
                assert_never(event)

    def _reserve(self, e: TaskReserved) -> None:
        self._expect(e.task, TaskStatus.TODO, e)
        self._todo.take(e.task)
        self._set(e.task, TaskStatus.RESERVED)
        self._reserved[e.task] = e.session
        self._held.setdefault(e.session, {})[e.task] = None

    def _cancel(self, e: ReservationCancelled) -> None:
        self._expect(e.task, TaskStatus.RESERVED, e)
        session = self._reserved.pop(e.task)
        self._unhold(session, e.task)
        self._requeue(e.task)

    def _assign(self, e: TaskAssigned) -> None:
        self._expect(e.task, TaskStatus.RESERVED, e)
        session = self._reserved[e.task]
        if session != e.assignment.session:
            raise InvalidTransition(f"{e}: reserved for session {session:x}")
        del self._reserved[e.task]
        self._set(e.task, TaskStatus.PENDING)
        self._pending[e.task] = e.assignment
        self._tasks_assigned = True

    def _finish(self, e: TaskFinished) -> None:
        assignment = self._take_pending(e.task, e.attempt, e)
        self._unhold(assignment.session, e.task)
        self._set(e.task, TaskStatus.DONE)

    def _fail(self, e: TaskFailed) -> None:
        assignment = self._take_pending(e.task, e.attempt, e)
        self._unhold(assignment.session, e.task)
        self._failures[e.task] = min(self._failures[e.task] + 1, 0xFFFF)
        self._failed_at[e.task] = e.revision
        if self._failures[e.task] > self._max_failures:
            self._set(e.task, TaskStatus.FAILED)
        else:
            self._requeue(e.task)

    def _release(self, e: TaskReleased) -> None:
        assignment = self._take_pending(e.task, e.attempt, e)
        self._unhold(assignment.session, e.task)
        self._requeue(e.task)

    def _split(self, e: TaskSplit) -> None:
        self._expect_live(e.task, e.attempt, e)
        if e.piece != len(self._status):
            raise InvalidTransition(f"{e}: the next piece is {len(self._status)}")
        if self._extents.get(e.task, (e.task, 0, e.end)) != (e.root, e.lo, e.end) \
                or not e.lo <= e.at < e.end:
            raise InvalidTransition(f"{e}: task {e.task} owns {self._extents.get(e.task)}")
        self._writing.discard(e.task)
        self._extents[e.task] = (e.root, e.lo, e.at)
        self._extents[e.piece] = (e.root, e.at, e.end)
        self._add_unit(e.piece)

    def _add_unit(self, piece: int, *, deal: bool = True) -> None:
        """A new todo unit, dealt before any other: it holds the epoch's end back."""
        self._status.append(_TODO)
        self._failures.append(0)
        self._counts[TaskStatus.TODO] += 1
        if deal:
            self._todo.push_front(piece)

    def _advance(self, e: EpochAdvanced) -> None:
        if e.epoch != self._epoch + 1 or not self.epoch_complete:
            raise InvalidTransition(f"{e}: epoch {self._epoch} is not complete")
        self._begin_epoch(e.epoch)

    def _restart(self, e: EpochRestarted) -> None:
        if not 0 <= e.epoch < self._num_epochs:
            raise InvalidTransition(f"{e}: outside 0..{self._num_epochs - 1}")
        # A restart of the epoch in progress keeps its cuts: a checkpoint names the units
        # (tasks and pieces) the model consumed, and the others are read again, each once.
        extents = dict(self._extents) if self.keeps_cuts(e.epoch) else {}
        units = self.restart_units(e.epoch)
        bad = [t for t in e.done if not 0 <= t < units]
        if bad or len(set(e.done)) != len(e.done):
            raise InvalidTransition(f"{e}: done tasks must be distinct ids in 0..{units - 1}")
        self._failed_job = False
        self._begin_epoch(e.epoch)
        self._add_pieces(extents)
        for task in e.done:  # the deal queue skips them lazily: their status says done
            self._set(task, TaskStatus.DONE)
        self._deal_pieces()

    def keeps_cuts(self, epoch: int) -> bool:
        """A restart of `epoch` keeps the splits' cuts and pieces: it is the epoch in progress."""
        return epoch == self._epoch

    def restart_units(self, epoch: int) -> int:
        """The ids a restart of `epoch` may name done: its pieces too when it is this epoch."""
        return len(self._status) if self.keeps_cuts(epoch) else self._num_tasks

    def _load_marks(self, e: MarksLoaded) -> None:
        """etcd's marks of the epoch onto a state just begun at it (`JobState.new`)."""
        if self._tasks_assigned or self._pending or self._reserved or self._failed_at:
            raise InvalidTransition(f"{e}: marks load only into a state just begun")
        num_tasks = self._num_tasks
        self._failed_job = e.failed_job
        done, failures = list(e.done), dict(e.failures)
        # what etcd shows of trainers having taken tasks (see `tasks_assigned`)
        self._tasks_assigned = bool(self._epoch > 0 or e.failed_job or done or failures or e.assignments)
        if self._epoch >= self._num_epochs:
            return  # a finished job: every task counts done
        self._add_pieces(e.extents)
        units = len(self._status)
        status = self._status  # all TODO here: one pass, then one count (a late epoch: ~1M marks)
        for task in done:
            if not 0 <= task < units:
                raise InvalidTransition(f"done mark of task {task} outside 0..{units - 1}")
            status[task] = TaskStatus.DONE
        marked = status.count(TaskStatus.DONE)
        self._counts[TaskStatus.TODO] -= marked
        self._counts[TaskStatus.DONE] += marked
        for task, count in failures.items():
            self._failures[task] = min(count, 0xFFFF)
            self._failed_at[task] = e.failed_at.get(task, 0)
            if count > self._max_failures and status[task] == TaskStatus.TODO:
                self._set(task, TaskStatus.FAILED)
        # oldest first, as the live path holds them (attempts are etcd revisions: they grow)
        for task, assignment in sorted(e.assignments.items(), key=lambda item: item[1].attempt):
            if status[task] == TaskStatus.TODO:
                self._set(task, TaskStatus.PENDING)
                self._pending[task] = assignment
                self._held.setdefault(assignment.session, {})[task] = None
        for task in failures:  # failed, still to deal: after the healthy ones, as live
            if status[task] == TaskStatus.TODO:
                self._todo.push_back(task, self._failed_at[task])
        if self._counts[TaskStatus.TODO] * 4 < num_tasks:  # late in the epoch: skip the done at once
            self._todo.restrict([t for t in range(num_tasks) if status[t] == _TODO])
        self._deal_pieces()

    def _fail_job(self, e: JobFailed) -> None:
        if e.epoch != self._epoch or not (self.epoch_complete and self.all_failed):
            raise InvalidTransition(f"{e}: not every task of epoch {self._epoch} failed")
        self._failed_job = True
        self._ending = False

    # -- helpers --

    def _begin_epoch(self, epoch: int) -> None:
        self._epoch = epoch
        over = epoch >= self._num_epochs
        self._status = bytearray([TaskStatus.DONE if over else TaskStatus.TODO]) * self._num_tasks
        self._failures = array("H", bytes(2 * self._num_tasks))
        self._reserved.clear()
        self._pending.clear()
        self._held.clear()
        self._writing.clear()
        self._failed_at.clear()
        self._extents.clear()
        self._ending = False
        self._todo = DealQueue(task_order(0 if over else self._num_tasks, seed=self._seed, epoch=epoch),
                               self._is_todo)
        if over:
            self._counts = [0, 0, 0, self._num_tasks, 0]
        else:
            self._counts = [self._num_tasks, 0, 0, 0, 0]

    def _is_todo(self, task: int) -> bool:
        return self._status[task] == _TODO

    def _set(self, task: int, status: TaskStatus) -> None:
        self._counts[self._status[task]] -= 1
        self._counts[status] += 1
        self._status[task] = status

    def _expect(self, task: int, status: TaskStatus, event: Event) -> None:
        if not 0 <= task < len(self._status) or self._status[task] != status:
            actual = TaskStatus(self._status[task]).name if 0 <= task < len(self._status) else "unknown"
            raise InvalidTransition(f"{event}: task is {actual}, expected {status.name}")

    def _expect_live(self, task: int, attempt: int, event: Event) -> Assignment:
        self._expect(task, TaskStatus.PENDING, event)
        assignment = self._pending[task]
        if assignment.attempt != attempt:
            raise InvalidTransition(f"{event}: live attempt is {assignment.attempt}")
        return assignment

    def _take_pending(self, task: int, attempt: int, event: Event) -> Assignment:
        assignment = self._expect_live(task, attempt, event)
        del self._pending[task]
        self._writing.discard(task)
        return assignment

    def _unhold(self, session: int, task: int) -> None:
        tasks = self._held.get(session)
        if tasks is not None:
            tasks.pop(task, None)
            if not tasks:
                del self._held[session]

    def _requeue(self, task: int) -> None:
        """Back to todo, at its place in the deal order (`master.partition.DealQueue`): a
        healthy task at its permutation position, ahead of the tasks not dealt yet (it holds
        the epoch's end back); one that failed in this epoch after the healthy ones, so a
        poisoned task does not crowd out healthy ones."""
        self._set(task, TaskStatus.TODO)
        if self._failures[task]:
            self._todo.push_back(task, self._failed_at[task])
        else:
            self._todo.push_front(task)
