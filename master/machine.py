"""The leading master's whole state of one job, as one machine: pure, no I/O, no clock.

Every piece of the job's state the master keeps changes by a named event applied by
`MasterMachine.apply`, dispatched by one exhaustive `match`: the tasks of the epoch (the
task part, `master.state.JobState`, whose events pass through here), the dataset's
adoption, the trainers' sessions, the phase, the trainer range and desired size, and
the save-model grant. A durable event (`Durable`) stands for one etcd transaction
(`master.transactions`); the core applies it only once etcd took that transaction, so
this object mirrors etcd. The others mirror what etcd did without a write of ours (a
session's lease lapsed or was revoked: `SessionEnded`), mark what only this master
knows (a session superseded or evicted, a trainer's call), or load etcd's snapshot.

Recovery is the same machine built the same way: `Loaded(snapshot)` through the same
`apply` (the dataset adopted at etcd's epoch, then its marks: `master.state.MarksLoaded`),
so a master rebuilt from etcd equals the one that ran, the deal order included
(docs/design.md section 5). Times (a session's calls, the save-model grant's end) come
in the events; nothing here reads the clock.

Subscription: a room that must act after an event (end an epoch once its last task is
done, watch the sessions from a loaded revision, release the save-model grant of a
session that ended) registers `subscribe(callback, *event_types)` at construction; every
`apply` of such an event calls it with the event once the machine changed. It is the one
way the machine tells anything.

Adding an event touches its dataclass here (in `Durable` if etcd must hold it), its case
in `apply` (and in `begin`/`abandon` if its write in flight marks something), its
transaction in `master.transactions`, and the room that commits it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import assert_never

from master import state as task_state
from master.config import DatasetSpec
from master.partition import FileEntry, Partition
from master.sessions import SessionRegistry
from master.state import Assignment, InvalidTransition, JobState
from paddlecloud.elastic import TrainerRange
from paddlecloud.phase import Phase


def partition_of(spec: DatasetSpec, files: list[FileEntry]) -> Partition:
    return Partition(files, chunk_bytes=spec.chunk_bytes, chunks_per_task=spec.chunks_per_task,
                     splits_files=spec.splits_files)


@dataclass
class Snapshot:
    """What etcd holds of one job, read at one revision (`master.snapshot.load`)."""

    revision: int
    spec: DatasetSpec | None = None
    files: list[FileEntry] = field(default_factory=list)
    epoch: int | None = None
    phase: Phase | None = None
    trainers: dict[str, int] = field(default_factory=dict)        # trainer id -> session
    superseded: dict[int, str] = field(default_factory=dict)      # old session -> trainer id
    assignments: dict[int, Assignment] = field(default_factory=dict)
    done: list[int] = field(default_factory=list)
    mirrored: bool = False      # `done` came from a standby's mirror, not read at `revision`
    failures: dict[int, int] = field(default_factory=dict)
    failed_at: dict[int, int] = field(default_factory=dict)       # task -> its failures key's revision
    pservers: dict[int, str] = field(default_factory=dict)
    trainer_range: TrainerRange | None = None
    trainers_desired: int | None = None
    save_model: str | None = None                                 # the grant's holder
    extents: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # the epoch's cut units


@dataclass(frozen=True)
class SaveGrant:
    trainer: str
    until: float  # monotonic seconds the grant lasts to (0: given by an earlier master)


# ---- events ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    """The machine becomes what etcd holds; `at` is when (sessions count their TTL from it)."""

    snapshot: Snapshot
    at: float


@dataclass(frozen=True)
class DatasetAdopted:
    """The dataset frozen, the job starting at `epoch` (its file list staged before)."""

    spec: DatasetSpec
    partition: Partition = field(compare=False)
    epoch: int


@dataclass(frozen=True)
class PhaseRecorded:
    phase: Phase  # the deployer's record of the job


@dataclass(frozen=True)
class TrainerRangeSet:
    span: TrainerRange   # written once: etcd's range wins over later flags
    desired: int


@dataclass(frozen=True)
class TrainersScaled:
    span: TrainerRange   # the range it was checked against (the write compares it)
    desired: int


@dataclass(frozen=True)
class SessionOpened:
    trainer: str
    session: int
    superseded: int | None  # the trainer's older session, remembered on the new one's lease
    at: float


@dataclass(frozen=True)
class SessionMarked:
    """`session` is being ended by this master: from now on its calls hear `mark`."""

    session: int
    trainer: str
    mark: str  # "superseded" | "evicted"


@dataclass(frozen=True)
class SessionCalled:
    session: int
    at: float
    refreshed: bool  # its lease was refreshed for this call


@dataclass(frozen=True)
class SessionEnded:
    """The session's lease is gone (revoked or lapsed), and with it its assignments in etcd."""

    session: int
    cause: str  # "expiry" | "leave" | "superseded" | "evicted"


@dataclass(frozen=True)
class SaveModelGranted:
    trainer: str
    lease: int     # the grant's key lives on it
    until: float


@dataclass(frozen=True)
class SaveModelReleased:
    trainer: str   # the write deletes the grant only if this trainer holds it


Durable = (task_state.Durable | DatasetAdopted | PhaseRecorded | TrainerRangeSet | TrainersScaled
           | SessionOpened | SaveModelGranted | SaveModelReleased)
Event = (task_state.Event | Loaded | SessionMarked | SessionCalled | SessionEnded | Durable)
TASK_EVENTS = (task_state.TaskReserved, task_state.ReservationCancelled, task_state.TaskAssigned,
               task_state.TaskFinished, task_state.TaskFailed, task_state.TaskReleased,
               task_state.TaskSplit, task_state.EpochAdvanced, task_state.EpochRestarted,
               task_state.JobFailed)
Callback = Callable[[Event], None]


class MasterMachine:
    """One job's state as the leading master holds it; see the module docstring."""

    def __init__(self, *, max_failures: int) -> None:
        self.max_failures = max_failures
        self.generation = 0                       # Loaded applied so far: a write older is moot
        self.spec: DatasetSpec | None = None
        self.partition: Partition | None = None
        self.tasks: JobState | None = None
        self.sessions = SessionRegistry()
        self.phase: Phase | None = None           # the `phase` key as etcd holds it
        self.phase_writing: Phase | None = None   # a PhaseRecorded in flight
        self.trainer_range: TrainerRange | None = None
        self.trainers_desired = 0
        self.save_grant: SaveGrant | None = None
        self._subscribers: dict[type, list[Callback]] = {}

    def __eq__(self, other: object) -> bool:
        """Equal in what etcd holds (the calls' times are this master's own)."""
        if not isinstance(other, MasterMachine):
            return NotImplemented
        return self._durable() == other._durable()

    __hash__ = None  # type: ignore[assignment]  (mutable)

    def _durable(self) -> tuple:
        s = self.sessions
        return (self.spec, self.tasks, self.phase, self.trainer_range, self.trainers_desired,
                self.save_grant.trainer if self.save_grant else None, s.by_trainer,
                {info.session: info.trainer for info in s.by_session.values()}, s.superseded)

    # -- subscription --

    def subscribe(self, callback: Callback, *event_types: type) -> None:
        """`callback(event)` after each `apply` of an event of one of `event_types`."""
        for kind in event_types:
            self._subscribers.setdefault(kind, []).append(callback)

    # -- queries --

    @property
    def phase_verdict(self) -> Phase | None:
        """The deployer's record of the job, with a write of it in flight counted as made
        (a RestartEpoch that would reopen the job sees the verdict at once)."""
        return self.phase_writing or self.phase

    def saving(self, now: float) -> bool:
        """A save-model grant this master gave is live at `now`, its holder's session too."""
        grant = self.save_grant
        return grant is not None and now < grant.until and grant.trainer in self.sessions.by_trainer

    @property
    def orphan_grant(self) -> str | None:
        """The save-model grant's holder when its session ended: the grant must be released."""
        grant = self.save_grant
        return grant.trainer if grant is not None and grant.trainer not in self.sessions.by_trainer else None

    def releasable(self, session: int) -> list[int]:
        """The tasks `session` holds that its end puts back (none with a write in flight:
        etcd refuses that write now, and its refusal puts the task back)."""
        state = self.tasks
        if state is None or session not in self.sessions.by_session:
            return []
        return [task for task in state.held_by(session)
                if state.assignment(task) is not None and not state.writing(task)]

    # -- writes in flight --

    def begin(self, event: Durable) -> None:
        """Marks `event`'s write as in flight (`JobState.begin` for a task's)."""
        if isinstance(event, TASK_EVENTS):
            self._tasks().begin(event)
        elif isinstance(event, PhaseRecorded):
            self.phase_writing = event.phase

    def abandon(self, event: Durable) -> None:
        """The write of `event` did not happen: unmark it."""
        if isinstance(event, TASK_EVENTS):
            if self.tasks is not None:
                self.tasks.abandon(event)
        elif isinstance(event, PhaseRecorded) and self.phase_writing is event.phase:
            self.phase_writing = None

    # -- transitions --

    def apply(self, event: Event) -> None:
        """Applies one event, or raises InvalidTransition; then tells its subscribers."""
        match event:
            case SessionCalled(session=session, at=at, refreshed=refreshed):  # first: every call's
                self.sessions.called(session, at=at, refreshed=refreshed)
            case task_state.TaskReserved() | task_state.ReservationCancelled() \
                    | task_state.TaskAssigned() | task_state.TaskFinished() | task_state.TaskFailed() \
                    | task_state.TaskReleased() | task_state.TaskSplit() | task_state.EpochAdvanced() \
                    | task_state.JobFailed() | task_state.MarksLoaded():
                self._tasks().apply(event)
                if isinstance(event, task_state.JobFailed):
                    self.phase = Phase.FAILED  # written in the same transaction
            case task_state.EpochRestarted():
                self._tasks().apply(event)
                self.phase, self.save_grant = Phase.RUNNING, None  # as its transaction writes
            case Loaded():
                self._load(event)
            case DatasetAdopted():
                self._adopt(event)
            case PhaseRecorded(phase=phase):
                self.phase = phase
                if self.phase_writing is phase:
                    self.phase_writing = None
            case TrainerRangeSet(span=span, desired=desired):
                if self.trainer_range is not None:
                    raise InvalidTransition(f"{event}: the job's range is {self.trainer_range} already")
                self.trainer_range, self.trainers_desired = span, desired
            case TrainersScaled(span=span, desired=desired):
                if span != self.trainer_range:
                    raise InvalidTransition(f"{event}: the job's range is {self.trainer_range}")
                self.trainers_desired = desired
            case SessionOpened(trainer=trainer, session=session, superseded=old, at=at):
                self.sessions.add(trainer, session, supersedes=old, at=at)
            case SessionMarked(session=session, trainer=trainer, mark=mark):
                if mark == "evicted":
                    self.sessions.mark_evicted(session, trainer)
                else:
                    self.sessions.mark_superseded(session, trainer)
            case SessionEnded():
                self._end_session(event)
            case SaveModelGranted(trainer=trainer, until=until):
                self.save_grant = SaveGrant(trainer, until)
            case SaveModelReleased(trainer=trainer):
                if self.save_grant is not None and self.save_grant.trainer == trainer:
                    self.save_grant = None
            case _:
                assert_never(event)
        for callback in self._subscribers.get(type(event), ()):
            callback(event)

    def _tasks(self) -> JobState:
        if self.tasks is None:
            raise InvalidTransition("the job has no dataset: no task event applies")
        return self.tasks

    def _load(self, e: Loaded) -> None:
        snap = e.snapshot
        self.generation += 1
        self.phase, self.phase_writing = snap.phase, None
        self.sessions.load(snap.trainers, snap.superseded, at=e.at)
        self.trainer_range, self.trainers_desired = snap.trainer_range, snap.trainers_desired or 0
        keep = self.save_grant if self.save_grant and self.save_grant.trainer == snap.save_model else None
        self.save_grant = keep or (SaveGrant(snap.save_model, 0.0) if snap.save_model else None)
        if snap.spec is None:
            return
        self._adopt(DatasetAdopted(snap.spec, partition_of(snap.spec, snap.files), snap.epoch or 0),
                    reload=True)
        live = self.sessions.by_session
        self._tasks().apply(task_state.MarksLoaded(
            failed_job=snap.phase is Phase.FAILED, done=snap.done, failures=snap.failures,
            failed_at=snap.failed_at, extents=snap.extents,
            assignments={t: a for t, a in snap.assignments.items() if a.session in live}))

    def _adopt(self, e: DatasetAdopted, *, reload: bool = False) -> None:
        if self.spec is not None and not reload:
            raise InvalidTransition(f"the job has a dataset already: {self.spec.to_json()}")
        self.spec, self.partition = e.spec, e.partition
        self.tasks = JobState.new(num_tasks=e.partition.num_tasks, num_epochs=e.spec.num_epochs,
                                  seed=e.spec.shuffle_seed, max_failures=self.max_failures, epoch=e.epoch)

    def _end_session(self, e: SessionEnded) -> None:
        released = self.releasable(e.session)
        registry = self.sessions
        registry.forget_superseded_by(e.session)
        info = registry.remove(e.session)
        if info is None:
            return
        state = self.tasks
        for task in released:
            assignment = state.assignment(task)
            state.apply(task_state.TaskReleased(task, assignment.attempt, e.cause))
