"""The leading master's domain core: decides from the cached `JobState`, makes etcd agree.

Each RPC becomes one call here; the servicer translates protobufs at the edge, so
nothing here sees one. A transition is applied to the cache only after the etcd
transaction that stands for it committed; while a write on a task is in flight the
task is `busy`, and any other report on it is STALE (it is being changed already).

The cache is rebuilt from etcd (`_rebuild`) when a write's outcome is unknown (etcd
did not answer) or etcd refused a write the cache thought valid. New calls wait at
the gate while that runs; calls already inside finish first.

What this does NOT do: keep trainer leases alive on its own, or read any data.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field

import aetcd

from master import metrics
from master.config import DatasetSpec, MasterConfig, SpecError
from master.partition import ChunkRange, FileEntry, Partition
from master.sessions import SessionExpired, SessionInfo, SessionRegistry, SessionSuperseded
from master.state import (
    Assignment,
    EpochAdvanced,
    EpochRestarted,
    JobFailed,
    JobState,
    Outcome,
    Phase,
    ReservationCancelled,
    TaskAssigned,
    TaskFailed,
    TaskFinished,
    TaskReleased,
    TaskReserved,
    TaskStatus,
)
from master.store import EtcdStore, NotLeader, StoreUnavailable, read_range
from paddlecloud.datasets import list_files
from paddlecloud.etcd import Leadership, LeaseKeeper
from paddlecloud.keys import JobKeys, prefix_range_end

logger = logging.getLogger(__name__)

WAIT_RETRY = 0.5          # seconds a trainer is told to wait when nothing is free
EPOCH_END_RETRY = 0.05    # ... when the epoch is complete and its end is being written
NO_DATASET_RETRY = 1.0


class InvalidArgument(ValueError):
    """The caller's fault; the message names the bad value."""


class FailedPrecondition(RuntimeError):
    """The request conflicts with the job's state; the message says which."""


@dataclass(frozen=True)
class TaskRef:
    task: int
    epoch: int
    attempt: int


@dataclass(frozen=True)
class TaskView:
    task: int
    epoch: int
    attempt: int
    chunks: list[ChunkRange]
    format: str


@dataclass(frozen=True)
class GetTaskResult:
    outcome: Outcome
    current_epoch: int
    task: TaskView | None = None
    retry_after: float = 0.0
    finished_results: list[bool] = field(default_factory=list)


@dataclass(frozen=True)
class Registration:
    session: int
    ttl: float
    current_epoch: int
    num_epochs: int


class Dispatcher:
    def __init__(self, *, client: aetcd.Client, config: MasterConfig, leadership: Leadership,
                 advertise: str) -> None:
        self.client = client
        self.config = config
        self.policy = config.policy
        self.keys = JobKeys(config.namespace, config.job)
        self.advertise = advertise
        self.store = EtcdStore(client, self.keys, leadership)
        self.keeper = LeaseKeeper(client)
        self.sessions = SessionRegistry(self.keeper, ttl=self.policy.session_ttl)
        self.spec: DatasetSpec | None = None
        self.partition: Partition | None = None
        self.state: JobState | None = None
        self.phase_override: str | None = None   # set by the deployer while it deploys
        self.loaded_phase: str | None = None     # the `phase` key as the last load found it
        self.requeued = 0                        # tasks put back since this master leads
        self.deposed: asyncio.Future[Exception] = asyncio.get_running_loop().create_future()
        self._busy: set[int] = set()
        self._ending: set[int] = set()           # sessions this master is revoking right now
        self._ready = asyncio.Event()
        self._inflight = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self._epoch_ending = False
        self._rebuilding: asyncio.Task[None] | None = None
        self._register_lock = asyncio.Lock()
        self._dataset_lock = asyncio.Lock()
        self._background: set[asyncio.Task] = set()
        self._watch_task: asyncio.Task[None] | None = None

    # ---- life cycle -------------------------------------------------------------

    async def start(self) -> None:
        await self.store.start()
        await self._load()
        if self.spec is None and self.config.dataset is not None:
            try:
                await self._adopt_dataset(self.config.dataset)
            except (InvalidArgument, FailedPrecondition) as error:
                raise SpecError(str(error)) from None  # bad flags: fatal, not retried
        elif self.spec is not None and self.config.dataset is not None:
            given = self.config.dataset.filled()
            if given != self.spec:
                raise SpecError(
                    f"job {self.config.job} already has a different dataset in etcd "
                    f"({self.spec.to_json()}); the flags give {given.to_json()}. "
                    "Delete the job's state (`paddlecloud job delete`, or --fresh locally) to change it"
                )
        self._spawn(self._deadline_loop(), "deadlines")
        self._ready.set()
        self._maybe_end_epoch()

    async def stop(self) -> None:
        """Stops serving: calls at the gate or in flight fail with NotLeader."""
        if not self.deposed.done():
            self.deposed.set_result(NotLeader(None))
        self._ready.set()  # wake the calls waiting at the gate: they see `deposed`
        for task in [*self._background, self._watch_task, self._rebuilding]:
            if task is not None:
                task.cancel()
        for task in [*self._background, self._watch_task, self._rebuilding]:
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await self.store.stop()
        await self.keeper.close()

    def _spawn(self, coro: Awaitable, name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._on_store_error(error, where=task.get_name())

    def _on_store_error(self, error: BaseException, *, where: str) -> None:
        if isinstance(error, NotLeader):
            if not self.deposed.done():
                self.deposed.set_result(error)
        elif isinstance(error, StoreUnavailable):
            logger.warning("%s: %s; rebuilding the cache from etcd", where, error)
            self._schedule_rebuild()
        else:
            logger.error("%s failed", where, exc_info=error)
            self._schedule_rebuild()

    async def _load(self) -> None:
        """(Re)builds the cache from one snapshot of etcd and (re)starts the session watch."""
        snap = await self.store.load()
        self.loaded_phase = snap.phase
        self.sessions.restore(snap.trainers, snap.superseded)
        self._busy.clear()
        self._epoch_ending = False
        if snap.spec is not None:
            self.spec = snap.spec
            self.partition = self._partition(snap.spec, snap.files)
            self.state = JobState.restore(
                num_tasks=self.partition.num_tasks, num_epochs=snap.spec.num_epochs,
                seed=snap.spec.shuffle_seed, max_failures=self.policy.max_task_failures,
                epoch=snap.epoch or 0, failed_job=snap.phase == Phase.FAILED.value,
                done=snap.done, failures=snap.failures,
                assignments={t: a for t, a in snap.assignments.items() if a.session in self.sessions.by_session},
            )
        if self._watch_task is not None:
            self._watch_task.cancel()
        self._watch_task = asyncio.create_task(self._watch_sessions(snap.revision + 1),
                                               name="watch-sessions")
        logger.info("cache loaded at revision %d: epoch %s, %d sessions, %d live assignments",
                    snap.revision, snap.epoch, len(snap.trainers), len(snap.assignments))

    @staticmethod
    def _partition(spec: DatasetSpec, files: list[FileEntry]) -> Partition:
        return Partition(files, chunk_bytes=spec.chunk_bytes, chunks_per_task=spec.chunks_per_task,
                         splits_files=spec.splits_files)

    def _schedule_rebuild(self) -> None:
        if self._rebuilding is None or self._rebuilding.done():
            self._rebuilding = asyncio.create_task(self._rebuild(), name="rebuild")

    async def _rebuild(self) -> None:
        self._ready.clear()
        try:
            while True:
                await self._drained.wait()
                try:
                    await self._load()
                    break
                except NotLeader as error:
                    if not self.deposed.done():
                        self.deposed.set_result(error)
                    return
                except Exception as error:
                    logger.warning("rebuild failed (%s); retrying", error)
                    await asyncio.sleep(1)
        finally:
            if not self.deposed.done():
                self._ready.set()
        self._maybe_end_epoch()

    @contextlib.asynccontextmanager
    async def _op(self):
        """Admits one call: waits while the cache is rebuilt; counts the call in flight."""
        if self.deposed.done():
            raise self.deposed.result()
        await self._ready.wait()
        if self.deposed.done():
            raise self.deposed.result()
        self._inflight += 1
        self._drained.clear()
        try:
            yield
        except (StoreUnavailable, NotLeader) as error:
            self._on_store_error(error, where="rpc")
            raise
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._drained.set()

    # ---- sessions ---------------------------------------------------------------

    async def register(self, trainer: str) -> Registration:
        if not trainer or trainer.strip() != trainer:
            raise InvalidArgument(f"trainer id {trainer!r} must be a non-empty string without spaces around it")
        async with self._op(), self._register_lock:
            lease = await self.client.lease(round(self.policy.session_ttl))
            old = self.sessions.by_trainer.get(trainer)
            try:
                if old is not None:
                    await self._end_session(old, cause="superseded", revoke=True)
                await self.store.open_session(trainer, lease.id, superseded=old)
            except BaseException:
                with contextlib.suppress(Exception):
                    await self.client.revoke_lease(lease.id)
                raise
            self.sessions.add(trainer, lease.id, supersedes=old)
            logger.info("trainer %s registered: session %d%s", trainer, lease.id,
                        f" (supersedes {old})" if old else "")
            state = self.state
            return Registration(
                session=lease.id, ttl=self.policy.session_ttl,
                current_epoch=state.epoch if state else 0,
                num_epochs=self.spec.num_epochs if self.spec else 0,
            )

    async def keep_alive(self, session: int) -> float:
        async with self._op():
            try:
                await self.sessions.touch(session, force=True)
            except (SessionExpired, SessionSuperseded) as error:
                await self._confirm_leadership()
                if isinstance(error, SessionExpired):
                    self._session_gone(session, cause="expiry")
                raise
            return self.policy.session_ttl

    async def leave(self, session: int) -> None:
        async with self._op():
            if session in self.sessions.by_session:
                await self._end_session(session, cause="leave", revoke=True)

    async def _end_session(self, session: int, *, cause: str, revoke: bool) -> None:
        self._ending.add(session)  # the watch sees the lease go first: let the cause be ours
        try:
            if revoke:
                with contextlib.suppress(aetcd.ClientError):
                    await self.client.revoke_lease(session)
            self._session_gone(session, cause=cause)
        finally:
            self._ending.discard(session)

    def _requeued(self, cause: str) -> None:
        self.requeued += 1
        metrics.REQUEUES.labels(cause).inc()

    def _session_gone(self, session: int, *, cause: str) -> None:
        """The session's lease is gone, so are its assignments in etcd: mirror that."""
        if cause != "superseded":
            self.sessions.forget_superseded_by(session)
        info = self.sessions.remove(session)
        state = self.state
        if info is None or state is None:
            return
        for task in state.held_by(session):
            if task in state.pending and task not in self._busy:
                state.apply(TaskReleased(task, state.pending[task].attempt, cause))
                self._requeued(cause)
        logger.info("session %d of trainer %s ended (%s)", session, info.trainer, cause)
        self._maybe_end_epoch()

    async def _watch_sessions(self, start_revision: int) -> None:
        """etcd deletes `trainers/<id>` when a lease lapses: that is how a dead trainer is seen."""
        prefix = self.keys.kind_prefix("trainers")
        try:
            watch = await self.client.watch(prefix, range_end=prefix_range_end(prefix),
                                            start_revision=start_revision, prev_kv=True)
            async for event in watch:
                if event.kind == "DELETE" and event.prev_kv is not None:
                    session = int(event.prev_kv.value)
                    if session in self.sessions.by_session and session not in self._ending:
                        self._session_gone(session, cause="expiry")
        except asyncio.CancelledError:
            raise
        except Exception as error:
            logger.warning("session watch broke (%s); rebuilding", error)
            self._schedule_rebuild()

    async def _touch(self, session: int) -> SessionInfo:
        try:
            return await self.sessions.touch(session)
        except (SessionExpired, SessionSuperseded) as error:
            # A paused, deposed leader would not know the sessions opened since: before it
            # tells a trainer to register again (or that its report is stale), make sure
            # it still leads.
            await self._confirm_leadership()
            if isinstance(error, SessionExpired):
                self._session_gone(session, cause="expiry")
            raise

    async def _confirm_leadership(self) -> None:
        current = await self.client.get(self.keys.leader)
        if current is None or current.create_revision != self.store.leadership.create_revision:
            error = NotLeader(current.value.decode() if current is not None else None)
            if not self.deposed.done():
                self.deposed.set_result(error)
            raise error

    # ---- tasks ------------------------------------------------------------------

    async def get_task(self, session: int, epoch: int, finished: list[TaskRef]) -> GetTaskResult:
        if epoch < 0:
            raise InvalidArgument(f"epoch {epoch} is negative: epochs count from 0")
        async with self._op():
            info = await self._touch(session)
            state = self.state
            if state is None:
                return GetTaskResult(Outcome.WAIT, 0, retry_after=NO_DATASET_RETRY,
                                     finished_results=[False] * len(finished))
            finishing = [self._start_finish(state, session, ref) for ref in finished]
            releasing = frozenset(ref.task for ref, f in zip(finished, finishing, strict=True) if f is not None)
            decision = state.decide(session=session, epoch=epoch,
                                    cap=self.policy.max_tasks_per_trainer, releasing=releasing)
            dispatch = None
            if decision.outcome is Outcome.TASK and decision.held is None:
                dispatch = self._start_dispatch(state, info, decision.task)
            try:
                results = [await self._end_finish(state, ref, f) if f is not None else False
                           for ref, f in zip(finished, finishing, strict=True)]
            except BaseException:
                if dispatch is not None:  # settle the reservation too; the caller retries
                    with contextlib.suppress(BaseException):
                        await self._end_dispatch(state, session, decision.task, dispatch)
                raise
            if decision.outcome is not Outcome.TASK:
                retry = 0.0
                if decision.outcome is Outcome.WAIT:
                    # The epoch's end is being written: the next epoch is a moment away.
                    retry = EPOCH_END_RETRY if state.epoch_complete else WAIT_RETRY
                return GetTaskResult(decision.outcome, state.epoch, retry_after=retry,
                                     finished_results=results)
            if decision.held is not None:
                view = self._view(decision.task, state.epoch, decision.held.attempt)
            else:
                attempt = await self._end_dispatch(state, session, decision.task, dispatch)
                if attempt is None:
                    return GetTaskResult(Outcome.WAIT, state.epoch, retry_after=0.05,
                                         finished_results=results)
                view = self._view(decision.task, state.epoch, attempt)
            return GetTaskResult(Outcome.TASK, state.epoch, task=view, finished_results=results)

    def _view(self, task: int, epoch: int, attempt: int) -> TaskView:
        assert self.partition is not None and self.spec is not None
        return TaskView(task, epoch, attempt, self.partition.task_chunks(task), self.spec.format)

    def _start_dispatch(self, state: JobState, info: SessionInfo, task: int):
        deadline = time.time() + self.policy.task_timeout if self.policy.task_timeout else 0.0
        state.apply(TaskReserved(task, info.session))
        assignment = Assignment(info.session, info.trainer, 0, deadline)
        return self.store.assign(task, state.epoch, assignment), assignment

    async def _end_dispatch(self, state: JobState, session: int, task: int, dispatch) -> int | None:
        future, assignment = dispatch
        try:
            attempt = await future
        except BaseException:
            if self.state is state and state.status[task] == TaskStatus.RESERVED:
                state.apply(ReservationCancelled(task))
            raise
        if self.state is not state:
            return None
        if attempt is None:
            # The session's key or the epoch moved under us: the session is gone, or the cache is stale.
            state.apply(ReservationCancelled(task))
            if session in self.sessions.by_session:
                self._schedule_rebuild()
            else:
                raise SessionExpired(session)
            return None
        state.apply(TaskAssigned(task, Assignment(session, assignment.trainer, attempt, assignment.deadline)))
        metrics.DISPATCHES.inc()
        return attempt

    def _start_finish(self, state: JobState, session: int, ref: TaskRef):
        """Queues the finish write when `ref` is this session's live assignment; else None (STALE)."""
        assignment = state.live_assignment(ref.task, ref.epoch, ref.attempt)
        if assignment is None or assignment.session != session or ref.task in self._busy:
            metrics.STALE_REPORTS.labels("finished").inc()
            return None
        self._busy.add(ref.task)
        return self.store.finish(ref.task, ref.epoch, ref.attempt)

    async def _end_finish(self, state: JobState, ref: TaskRef, future) -> bool:
        accepted = await self._settle(state, ref.task, ref.attempt, future,
                                      TaskFinished(ref.task, ref.attempt))
        (metrics.FINISHES if accepted else metrics.STALE_REPORTS.labels("finished")).inc()
        return accepted

    async def _settle(self, state: JobState, task: int, attempt: int, future, event) -> bool:
        """Awaits the write on a busy task; mirrors `event` in the cache when etcd took it."""
        try:
            revision = await future
        finally:
            self._busy.discard(task)
        if self.state is not state:  # the cache was rebuilt from etcd meanwhile
            return revision is not None
        if revision is None:
            self._write_refused(state, task, attempt)
            return False
        state.apply(event)
        self._maybe_end_epoch()
        return True

    def _write_refused(self, state: JobState, task: int, attempt: int) -> None:
        """etcd refused a write on a task the cache held live: its session must be gone."""
        assignment = state.pending.get(task)
        if assignment is None or assignment.attempt != attempt:
            return
        if assignment.session not in self.sessions.by_session:
            state.apply(TaskReleased(task, attempt, "expiry"))
            self._requeued("expiry")
            self._maybe_end_epoch()
        else:
            self._schedule_rebuild()

    async def task_finished(self, session: int, ref: TaskRef) -> bool:
        async with self._op():
            state = await self._report_state(session)
            if state is None:
                return False
            future = self._start_finish(state, session, ref)
            return await self._end_finish(state, ref, future) if future is not None else False

    async def _report_state(self, session: int) -> JobState | None:
        """Reports are never errors for staleness: an unknown session's report is STALE."""
        try:
            await self._touch(session)
        except (SessionExpired, SessionSuperseded):
            return None
        return self.state

    async def task_failed(self, session: int, ref: TaskRef, reason: str) -> bool:
        async with self._op():
            state = await self._report_state(session)
            if state is None or not self._is_live(state, session, ref):
                metrics.STALE_REPORTS.labels("failed").inc()
                return False
            logger.info("task %d (epoch %d, attempt %d) failed: %s", ref.task, ref.epoch, ref.attempt, reason)
            return await self._fail(state, ref.task, ref.attempt, cause="failure")

    async def return_task(self, session: int, ref: TaskRef) -> bool:
        async with self._op():
            state = await self._report_state(session)
            if state is None or not self._is_live(state, session, ref):
                metrics.STALE_REPORTS.labels("returned").inc()
                return False
            self._busy.add(ref.task)
            returned = await self._settle(state, ref.task, ref.attempt,
                                          self.store.release(ref.task, ref.attempt),
                                          TaskReleased(ref.task, ref.attempt, "return"))
            if returned:
                self._requeued("return")
            return returned

    def _is_live(self, state: JobState, session: int, ref: TaskRef) -> bool:
        assignment = state.live_assignment(ref.task, ref.epoch, ref.attempt)
        return assignment is not None and assignment.session == session and ref.task not in self._busy

    async def _fail(self, state: JobState, task: int, attempt: int, *, cause: str) -> bool:
        self._busy.add(task)
        write = self.store.fail(task, state.epoch, attempt, failures_before=state.failures[task])
        if not await self._settle(state, task, attempt, write, TaskFailed(task, attempt, cause)):
            return False
        self._requeued("deadline" if cause == "deadline" else "failure")
        return True

    async def _deadline_loop(self) -> None:
        if not self.policy.task_timeout:
            return
        period = min(1.0, self.policy.task_timeout / 4)
        while True:
            await asyncio.sleep(period)
            state = self.state
            if state is None or not self._ready.is_set():
                continue
            for task, assignment in list(state.expired(time.time())):
                if task not in self._busy:
                    logger.info("task %d passed its deadline (trainer %s)", task, assignment.trainer)
                    self._spawn(self._guarded(self._fail(state, task, assignment.attempt, cause="deadline")),
                                f"deadline-{task}")

    async def _guarded(self, coro: Awaitable) -> None:
        async with self._op():
            await coro

    # ---- epochs -----------------------------------------------------------------

    def _maybe_end_epoch(self) -> None:
        state = self.state
        if state is None or self._epoch_ending or not state.epoch_complete:
            return
        self._epoch_ending = True
        self._spawn(self._guarded(self._end_epoch(state)), "end-epoch")

    async def _end_epoch(self, state: JobState) -> None:
        try:
            epoch = state.epoch
            if state.all_failed:
                if await self.store.fail_job(epoch) and self.state is state:
                    state.apply(JobFailed(epoch))
                    logger.error("every task of epoch %d failed: the job failed", epoch)
                return
            if await self.store.advance_epoch(epoch, num_epochs=state.num_epochs):
                if self.state is state and state.epoch == epoch:
                    state.apply(EpochAdvanced(epoch + 1))
                    metrics.EPOCHS.inc()
                    logger.info("epoch %d complete", epoch)
            else:
                self._schedule_rebuild()
        finally:
            self._epoch_ending = False
        self._maybe_end_epoch()

    async def restart_epoch(self, epoch: int) -> int:
        async with self._op():
            state = self.state
            if state is None:
                raise FailedPrecondition("the job has no dataset yet: nothing to restart")
            if not 0 <= epoch < state.num_epochs:
                raise InvalidArgument(f"epoch {epoch} is outside 0..{state.num_epochs - 1}")
        # Exclusive: no call may be in flight while every assignment is dropped.
        self._ready.clear()
        try:
            await self._drained.wait()
            await self.store.restart_epoch(epoch)  # sessions stay; their assignments are gone
            if self.state is state:
                state.apply(EpochRestarted(epoch))
                self._busy.clear()
            logger.info("epoch %d restarted", epoch)
            return epoch
        except (StoreUnavailable, NotLeader) as error:
            self._on_store_error(error, where="restart-epoch")
            raise
        finally:
            if not self.deposed.done():
                self._ready.set()

    # ---- dataset ----------------------------------------------------------------

    async def set_dataset(self, spec: DatasetSpec) -> int:
        async with self._op():
            return await self._adopt_dataset(spec)

    async def _adopt_dataset(self, spec: DatasetSpec) -> int:
        try:
            filled = spec.filled()
        except SpecError as error:
            raise InvalidArgument(str(error)) from None
        async with self._dataset_lock:
            if self.spec is not None:
                if filled != self.spec:
                    raise FailedPrecondition(
                        f"the job already has a different dataset: {self.spec.to_json()}")
                assert self.partition is not None
                return self.partition.num_tasks
            try:
                files = await asyncio.to_thread(list_files, filled.paths)
            except SpecError as error:
                raise InvalidArgument(str(error)) from None
            partition = self._partition(filled, files)
            if partition.num_tasks == 0:
                raise InvalidArgument(f"dataset {list(filled.paths)!r} has no data: every file is empty")
            if not await self.store.freeze_dataset(filled, files, epoch=self.config.start_epoch):
                raise FailedPrecondition("another master froze a dataset for this job first")
            self.spec, self.partition = filled, partition
            self.state = JobState.new(num_tasks=partition.num_tasks, num_epochs=filled.num_epochs,
                                      seed=filled.shuffle_seed, max_failures=self.policy.max_task_failures,
                                      epoch=self.config.start_epoch)
            logger.info("dataset frozen: %d files, %d chunks, %d tasks, %d epochs (starting at %d)",
                        len(files), partition.num_chunks, partition.num_tasks, filled.num_epochs,
                        self.config.start_epoch)
            return partition.num_tasks

    # ---- save-model grant -------------------------------------------------------

    async def request_save_model(self, session: int, block: float) -> bool:
        if block <= 0:
            raise InvalidArgument(f"block {block:g}s must be positive")
        async with self._op():
            info = await self._touch(session)
            current = await self.client.get(self.keys.save_model)
            if current is not None:
                return current.value.decode() == info.trainer
            lease = await self.client.lease(max(1, round(block)))
            granted = await self.store.grant_save_model(info.trainer, lease.id)
            if not granted:
                with contextlib.suppress(Exception):
                    await self.client.revoke_lease(lease.id)
            return granted

    # ---- deployment -------------------------------------------------------------

    async def registered_pservers(self) -> int:
        prefix = self.keys.kind_prefix("pservers")
        kvs, _ = await read_range(self.client, prefix, prefix_range_end(prefix), keys_only=True)
        return len(kvs)

    async def record_phase(self, phase: str) -> None:
        """The deployer's phase: a fenced write of the `phase` key, shown by GetStatus."""
        await self.store.set_phase(phase)
        self.phase_override = phase

    def dataset_done(self) -> bool:
        return self.state is not None and self.state.job_over

    def dataset_failed(self) -> bool:
        return self.state is not None and self.state.failed_job
