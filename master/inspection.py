"""What operators see of a leading master: status, tasks, trainers, metrics gauges.

Read-only views of the dispatcher's cache (through `JobState`'s queries) and, for
pservers, of etcd (through the store), kept apart from the rooms so they hold only
what changes state. The numbers are this master's cache, which mirrors etcd;
`trainers`' last-call times start when it began to lead.

Session ids and attempts (what a forged report would need) are shown to the operator
only (`reveal_sessions`); page tokens are checked (INVALID_ARGUMENT for one this
master did not give).

What this does NOT do: change anything, or show an epoch other than the current one
(but for the status page's bars of past epochs, which `master.epochs` keeps).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from operator import attrgetter

from master.core import InvalidArgument
from master.dispatcher import Dispatcher
from master.partition import ChunkRange
from master.sessions import SessionInfo
from master.state import TaskStatus
from master.stealing import unit_chunks
from master.trainers import is_trainer_id
from paddlecloud.phase import Phase
from paddlecloud.untrusted import quote

MAX_PAGE = 1000
DEFAULT_PAGE = 100


@dataclass(frozen=True)
class Status:
    job: str
    namespace: str
    phase: str
    leader: str
    epoch: int
    num_epochs: int
    counts: dict[str, int]
    num_tasks: int
    trainers_alive: int
    pservers: list[str]
    has_dataset: bool
    requeued: int
    min_trainers: int = 0      # the trainer range and desired size; 0 without a range
    max_trainers: int = 0
    desired_trainers: int = 0
    trainer_seconds: dict[str, float] | None = None  # goodput: by cause (master.goodput)
    tasks_assigned: bool = False  # a trainer ever took a task (JobState.tasks_assigned)
    splits_this_epoch: int = 0  # work stealing: tasks split in the current epoch (etcd's)
    splits: int = 0             # ... since this master leads


@dataclass(frozen=True)
class TaskInfo:
    task: int
    status: TaskStatus
    epoch: int
    holder: str
    session: int
    attempt: int
    failures: int
    chunks: list[ChunkRange]


@dataclass(frozen=True)
class TrainerView:
    trainer: str
    session: int
    tasks: list[int]
    since_last_call: float


async def status(d: Dispatcher) -> Status:
    core = d.core
    state = core.state
    pservers = await d.store.pservers()
    counts = {"todo": 0, "pending": 0, "done": 0, "failed": 0}
    if state is not None:
        c = state.counts
        counts = {"todo": c[TaskStatus.TODO], "pending": c[TaskStatus.PENDING] + c[TaskStatus.RESERVED],
                  "done": c[TaskStatus.DONE], "failed": c[TaskStatus.FAILED]}
    phase = state.phase if state is not None else Phase.PENDING
    override = d.deployment.phase_override
    if override and phase in (Phase.PENDING, Phase.RUNNING):
        phase = override  # the deployer knows whether the job runs yet
    return Status(
        job=d.config.job, namespace=d.config.namespace, phase=phase.value, leader=d.advertise,
        epoch=state.epoch if state else 0, num_epochs=core.spec.num_epochs if core.spec else 0,
        counts=counts, num_tasks=state.units if state else 0,  # pieces too: the counts add up
        trainers_alive=len(core.sessions.by_session), pservers=pservers,
        has_dataset=state is not None, requeued=core.requeued, **_trainer_size(d),
        trainer_seconds=d.accounting.meter.figures(),
        tasks_assigned=state is not None and state.tasks_assigned,
        splits_this_epoch=state.splits if state is not None else 0, splits=d.stealing.splits,
    )


def _trainer_size(d: Dispatcher) -> dict[str, int]:
    span = d.scaling.span
    if span is None:
        return {}
    return {"min_trainers": span.minimum, "max_trainers": span.maximum,
            "desired_trainers": d.scaling.desired}


def metrics_snapshot(d: Dispatcher) -> dict:
    """The gauges Prometheus reads at scrape time (see master.metrics.StateCollector)."""
    state = d.core.state
    counts = state.counts if state is not None else None
    tasks = {s.name.lower(): counts[s] for s in TaskStatus} if counts is not None else {}
    return {"tasks": tasks, "epoch": state.epoch if state else 0,
            "sessions": len(d.core.sessions.by_session), **_trainer_size(d),
            "trainer_seconds": d.accounting.meter.figures()}


def _page_size(page_size: int) -> int:
    if page_size < 0:
        raise InvalidArgument(f"page_size {page_size} is negative")
    return min(page_size or DEFAULT_PAGE, MAX_PAGE)


def _task_token(page_token: str, num_tasks: int) -> int:
    """The task a ListTasks page starts at: a token this master gave (a task id), else INVALID_ARGUMENT."""
    if not page_token:
        return 0
    if (len(page_token) > 20 or not (page_token.isascii() and page_token.isdigit())
            or int(page_token) >= max(num_tasks, 1)):
        raise InvalidArgument(f"page_token {quote(page_token)} is not one this master gave: "
                              "pass the next_page_token of the previous page, or nothing")
    return int(page_token)


def list_tasks(d: Dispatcher, *, status: TaskStatus | None, epoch: int | None, page_size: int,
               page_token: str, reveal_sessions: bool = True) -> tuple[list[TaskInfo], str]:
    """The current epoch's tasks (and pieces, with the bytes they own) in id order from
    `page_token`, optionally of one state;
    session ids and attempts are 0 unless `reveal_sessions` (the operator's view)."""
    state, partition = d.core.state, d.core.partition
    if state is None or partition is None:
        return [], ""
    if epoch is not None and epoch != state.epoch:
        raise InvalidArgument(
            f"epoch {epoch}: only the current epoch {state.epoch} is kept (done marks of "
            "an epoch are deleted when it ends)")
    size = _page_size(page_size)
    units = state.units  # the tasks, then this epoch's pieces (work stealing)
    start = _task_token(page_token, units)
    statuses, failures = state.status, state.failures
    found: list[TaskInfo] = []
    task = start
    while task < units and len(found) < size:
        raw = TaskStatus(statuses[task])
        shown = TaskStatus.PENDING if raw is TaskStatus.RESERVED else raw
        if status is None or shown is status:
            a = state.assignment(task)
            secret = a is None or not reveal_sessions
            found.append(TaskInfo(task, shown, state.epoch, a.trainer if a else "",
                                  0 if secret else a.session, 0 if secret else a.attempt,
                                  failures[task], unit_chunks(partition, state, task)))
        task += 1
    return found, (str(task) if task < units else "")


def list_trainers(d: Dispatcher, *, page_size: int, page_token: str,
                  reveal_sessions: bool = True) -> tuple[list[TrainerView], str]:
    """Live sessions in trainer-id order after `page_token` (a trainer id this master gave),
    with the tasks they hold; session ids are 0 unless `reveal_sessions`."""
    size = _page_size(page_size)
    if page_token and not is_trainer_id(page_token):
        raise InvalidArgument(f"page_token {quote(page_token)} is not one this master gave: "
                              "pass the next_page_token of the previous page, or nothing")
    now = time.monotonic()
    sessions = d.core.sessions
    ids = sorted(t for t in sessions.by_trainer if t > page_token)
    views = [_trainer_view(d, sessions.by_session[sessions.by_trainer[trainer]], now, reveal=reveal_sessions)
             for trainer in ids[:size]]
    return views, (ids[size - 1] if len(ids) > size else "")


# ---- views of the status page (`master.web`) ---------------------------------------------


RECENT_EPOCHS = 3  # past epochs the page draws one by one; older ones share one summary bar


@dataclass(frozen=True)
class EpochBar:
    """One epoch's tasks, or (`epochs` > 1) the sum over a run of epochs from `epoch` on.

    A past epoch shows how it ended (tasks done and failed) when this master ended it;
    etcd deletes an epoch's marks at its end, so one another master ended is counted in
    `unknown` and drawn as neither done nor failed. The future is one bar of todo."""

    epoch: int
    stage: str  # "past", "current" or "future"
    done: int
    pending: int
    todo: int
    failed: int
    epochs: int = 1
    unknown: int = 0  # past epochs of the bar whose counts this master does not know


@dataclass(frozen=True)
class TaskFailures:
    task: int
    status: TaskStatus
    failures: int


def epoch_bars(d: Dispatcher, *, recent: int = RECENT_EPOCHS) -> list[EpochBar]:
    """The epochs of the job in order: a summary of the older past, the `recent` last past
    epochs one by one, the current one and a summary of the future; none before the job
    has a dataset. A few bars at any epoch count: the page keeps its plots on screen."""
    state = d.core.state
    if state is None:
        return []
    current = min(state.epoch, state.num_epochs)
    first_recent = max(0, current - recent)
    bars = []
    if first_recent:
        bars.append(_past_bar(d, range(0, first_recent)))
    bars.extend(_past_bar(d, range(epoch, epoch + 1)) for epoch in range(first_recent, current))
    if state.epoch < state.num_epochs:
        c = state.counts
        bars.append(EpochBar(state.epoch, "current", c[TaskStatus.DONE],
                             c[TaskStatus.PENDING] + c[TaskStatus.RESERVED], c[TaskStatus.TODO],
                             c[TaskStatus.FAILED]))
        future = state.num_epochs - state.epoch - 1
        if future:
            bars.append(EpochBar(state.epoch + 1, "future", 0, 0, state.num_tasks * future, 0,
                                 epochs=future))
    return bars


def _past_bar(d: Dispatcher, epochs: range) -> EpochBar:
    """The ended `epochs` summed: done and failed of those this master ended, the rest unknown."""
    ended = d.epochs.ended
    known = [ended[e] for e in epochs if e in ended]
    return EpochBar(epochs.start, "past", sum(e.done for e in known), 0, 0, sum(e.failed for e in known),
                    epochs=len(epochs), unknown=len(epochs) - len(known))


def all_trainers(d: Dispatcher) -> list[TrainerView]:
    """Every live session, in trainer-id order (`list_trainers` without pages)."""
    now = time.monotonic()
    sessions = d.core.sessions
    return [_trainer_view(d, sessions.by_session[sessions.by_trainer[trainer]], now)
            for trainer in sorted(sessions.by_trainer)]


def trainers_to_show(d: Dispatcher, *, limit: int) -> tuple[list[TrainerView], int]:
    """At most `limit` live sessions for the status page, and how many were left out.

    All of them in trainer-id order when they fit; else the `limit` longest since their
    last call (the likeliest to be stuck), longest first, picked without sorting the
    rest: a page that lists them all costs the master's loop time in proportion to the
    trainers on every refresh, which thousands of trainers make long."""
    infos = d.core.sessions.by_session.values()
    if len(infos) <= limit:
        return all_trainers(d), 0
    now = time.monotonic()
    stalest = heapq.nsmallest(limit, infos, key=attrgetter("last_call"))
    return [_trainer_view(d, info, now) for info in stalest], len(infos) - limit


def _trainer_view(d: Dispatcher, info: SessionInfo, now: float, *, reveal: bool = True) -> TrainerView:
    """One live session as operators see it (its id 0 unless `reveal`)."""
    state = d.core.state
    return TrainerView(info.trainer, info.session if reveal else 0,
                       state.held_by(info.session) if state else [], now - info.last_call)


def failed_tasks(d: Dispatcher, *, limit: int) -> list[int]:
    """Up to `limit` tasks of the current epoch that failed for good, in id order."""
    state = d.core.state
    if state is None or not state.counts[TaskStatus.FAILED]:
        return []
    failed = TaskStatus.FAILED.value
    return [task for task, status in enumerate(state.status) if status == failed][:limit]


def task_failures(d: Dispatcher, tasks: list[int]) -> list[TaskFailures]:
    """The current epoch's status and failure count of each task named (unknown ids skipped)."""
    state = d.core.state
    if state is None:
        return []
    statuses, failures = state.status, state.failures
    found = []
    for task in tasks:
        if 0 <= task < state.num_tasks:
            raw = TaskStatus(statuses[task])
            found.append(TaskFailures(task, TaskStatus.PENDING if raw is TaskStatus.RESERVED else raw,
                                      failures[task]))
    return found


def failure_reason(d: Dispatcher) -> str:
    """Why the job failed, as far as this master knows; "" when it did not."""
    state = d.core.state
    if state is not None and state.failed_job:
        return (f"every task of epoch {state.epoch} failed "
                f"(each after {d.core.policy.max_task_failures} failures)")
    if d.recorded_phase is Phase.FAILED:
        return "the job's deployment failed (the master's log and its Deployment's annotations say why)"
    return ""
