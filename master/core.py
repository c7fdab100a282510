"""The leading master's core: the cache of one job, the gate every call passes, and
the one way the cache changes (`commit`: write the event durably, then apply it).

The cache is the master's one machine (`master.machine.MasterMachine`: the dataset, the
tasks, the sessions, the phase, the trainer range and the save-model grant), and it
mirrors etcd. It is
rebuilt from etcd (`schedule_rebuild`) when a write's outcome is unknown (etcd did
not answer), when etcd refused a write the cache thought valid, or when an event did
not fit the cache (`InvalidTransition`: logged with its traceback; the caller is told
to retry). New calls wait at the gate while the rebuild runs; calls already inside
finish first. The rooms (`master.trainers`, `master.tasks`, `master.epochs`, ...)
decide; this module is where their decisions become writes and cache changes, and
where the clock enters the machine's events it applies itself (a load's time).

What this does NOT do: decide what to write (the rooms do), or talk to etcd other
than through `master.store`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Coroutine
from typing import Any

from master import metrics
from master.config import DatasetSpec, MasterConfig
from master.machine import Durable, Event, Loaded, MasterMachine
from master.partition import Partition
from master.sessions import SessionRegistry
from master.snapshot import MarkMirror
from master.state import (
    InvalidTransition,
    JobState,
    TaskFailed,
    TaskFinished,
    TaskReleased,
    TaskSplit,
    committed,
)
from master.store import EtcdStore
from master.store_errors import NotLeader, StoreUnanswered, StoreUnavailable
from paddlecloud.aio import cancel_and_wait
from paddlecloud.phase import Phase

logger = logging.getLogger(__name__)

REBUILD_RETRY = 1.0  # seconds between attempts to reload the cache from etcd


class InvalidArgument(ValueError):
    """The caller's fault; the message names the bad value."""


class FailedPrecondition(RuntimeError):
    """The request conflicts with the job's state; the message says which."""


class CacheOutOfStep(Exception):
    """An event did not fit the cache: it is being rebuilt from etcd; the caller retries."""


class TooSlow(Exception):
    """The master answered slower than the session TTL: a lease it granted for the call lapsed
    before the call's write reached etcd. Nothing was recorded; the caller retries."""


class _Admission:
    """`Core.admitted()`: a class, not an async generator (it wraps every call of the master;
    `contextlib.asynccontextmanager` costs an async generator and two awaits more)."""

    __slots__ = ("_core",)

    def __init__(self, core: Core) -> None:
        self._core = core

    async def __aenter__(self) -> None:
        core = self._core
        if not core.serving:
            await core._until_open()
        core._enter()

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None, tb) -> bool:
        self._core._leave(error)
        return False


class Core:
    def __init__(self, *, store: EtcdStore, config: MasterConfig,
                 standby_marks: MarkMirror | None = None) -> None:
        self.store = store
        self.config = config
        self.policy = config.policy
        self.machine = MasterMachine(max_failures=self.policy.max_task_failures)
        self.standby_marks = standby_marks  # the standby's mirror, for the first load
        self.requeued = 0                        # tasks put back since this master leads
        self.deposed: asyncio.Future[Exception] = asyncio.get_running_loop().create_future()
        self._ready = asyncio.Event()
        self._inflight = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self._rebuilding: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task] = set()

    # ---- the machine's parts, read-only ---------------------------------------------

    @property
    def state(self) -> JobState | None:
        """The tasks of the current epoch (None before the dataset is adopted)."""
        return self.machine.tasks

    @property
    def spec(self) -> DatasetSpec | None:
        return self.machine.spec

    @property
    def partition(self) -> Partition | None:
        return self.machine.partition

    @property
    def sessions(self) -> SessionRegistry:
        return self.machine.sessions

    @property
    def recorded_phase(self) -> Phase | None:
        """The `phase` key as etcd holds it, a write of it in flight counted as made: the
        deployer's record of the job (Pending .. Succeeded/Failed), or Failed by the data. The
        data's end is the `epoch` key (>= num_epochs), not this: Succeeded here is a
        deployer's final verdict."""
        return self.machine.phase_verdict

    # ---- the gate -----------------------------------------------------------------

    def open(self) -> None:
        self._ready.set()

    @property
    def serving(self) -> bool:
        """The gate is open (no rebuild or exclusive call under way)."""
        return self._ready.is_set()

    def admitted(self) -> _Admission:
        """Admits one call (`async with core.admitted():`): waits while the cache is rebuilt;
        counts the call in flight.

        The seams are decided here: a store fault deposes this master (NotLeader) or
        rebuilds the cache (StoreUnavailable, but not StoreUnanswered: a read or a lease
        call wrote nothing) and goes on up; an InvalidTransition is a
        cache out of step (or a bug): logged with its traceback, the cache rebuilt, and
        the caller told to retry (CacheOutOfStep).
        """
        return _Admission(self)

    async def _until_open(self) -> None:
        if self.deposed.done():
            raise self.deposed.result()
        await self._ready.wait()

    def _enter(self) -> None:
        if self.deposed.done():
            raise self.deposed.result()
        self._inflight += 1
        self._drained.clear()

    def _leave(self, error: BaseException | None) -> None:
        try:
            if isinstance(error, (StoreUnavailable, NotLeader)):
                self.on_store_error(error, where="rpc")
            elif isinstance(error, InvalidTransition):
                raise self._out_of_step(error) from error
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._drained.set()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Closes the gate and waits until no call is in flight (call it outside `admitted`)."""
        self._ready.clear()
        try:
            await self._drained.wait()
            yield
        except (StoreUnavailable, NotLeader) as error:
            self.on_store_error(error, where="exclusive")
            raise
        finally:
            if not self.deposed.done():
                self._ready.set()

    async def guarded(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Runs a background step as a call through the gate."""
        try:
            async with self.admitted():
                await coro
        finally:
            coro.close()  # not started when the gate refused it

    # ---- the one way the cache changes ----------------------------------------------

    def commit(self, event: Durable) -> Awaitable[int | None]:
        """Writes `event` durably, then applies it to the machine.

        The write is marked in flight in the machine and its transaction queued now, so
        the writes of one call ride the same group-commit batch; await the result: the
        revision etcd took it at, or None when a compare failed (the mark is then gone
        and the machine unchanged: the caller decides what a refusal means).
        """
        self.machine.begin(event)
        return self.write(event)

    def write(self, event: Durable) -> Awaitable[int | None]:
        """`commit()` of an event whose write `machine.begin` already marked.

        The machine takes etcd's answer as it comes (`_settle`), whether or not the caller
        still awaits it: a call cancelled while its write is on the wire (the trainer's
        connection dropped) cancels only its wait, for etcd applies the write all the same.
        """
        settle = functools.partial(self._settle, self.machine.generation, event)
        try:
            return self.store.submit(event, self.machine, settle)
        except BaseException:
            self.machine.abandon(event)
            raise

    def _settle(self, generation: int, event: Durable, revision: int | None,
                error: BaseException | None) -> None:
        """etcd's answer to the write of `event`, taken into the machine: applied, or unmarked
        when refused or failed. A failed write's outcome is unknown (etcd may hold it): the
        cache is rebuilt, here too, for its caller may be gone (its `_leave` logs it)."""
        machine = self.machine
        if machine.generation != generation:  # rebuilt from etcd meanwhile: etcd has it, or not
            return
        if error is not None or revision is None:
            machine.abandon(event)
            if error is None:
                self._refused(event)
            elif isinstance(error, NotLeader):
                self.depose(error)
            elif isinstance(error, StoreUnavailable):
                self.schedule_rebuild()
            return
        try:
            machine.apply(committed(event, revision))
        except InvalidTransition as raised:
            raise self._out_of_step(raised) from raised

    def _refused(self, event: Durable) -> None:
        """etcd refused a report (finish, failure, return) on a task the cache holds live: its
        session lapsed (the watch may not have told yet: the task goes back now), or the cache
        is out of step. A refused deal or epoch end is its caller's to explain."""
        if not isinstance(event, (TaskFinished, TaskFailed, TaskReleased, TaskSplit)):
            return
        state = self.state
        assignment = state.assignment(event.task)
        if assignment is None or assignment.attempt != event.attempt:
            return
        if assignment.session not in self.sessions.by_session:
            self.apply(TaskReleased(event.task, event.attempt, "expiry"))
            self.count_requeue("expiry")
        else:
            logger.warning("etcd refused a report on task %d (attempt %d) of live session %d: the "
                           "cache is out of step; rebuilding it from etcd", event.task, event.attempt,
                           assignment.session)
            self.schedule_rebuild()

    def _out_of_step(self, error: InvalidTransition) -> CacheOutOfStep:
        """An event did not fit the cache (a bug, or the cache out of step): logged, the cache
        rebuilt; the caller is told to retry."""
        logger.error("a transition did not fit the cache; rebuilding it from etcd", exc_info=error)
        self.schedule_rebuild()
        return CacheOutOfStep(f"the master's cache is being rebuilt ({error}): retry")

    def apply(self, event: Event) -> None:
        """Applies an event that is no write of ours: etcd did it already (a lapsed or
        revoked lease took the keys with it), or only this master knows it (a call)."""
        self.machine.apply(event)

    def count_requeue(self, cause: str) -> None:
        self.requeued += 1
        metrics.REQUEUES.labels(cause).inc()

    # ---- loading and rebuilding -------------------------------------------------------

    async def load(self) -> None:
        """(Re)builds the cache from one snapshot of etcd."""
        started = time.monotonic()
        mirror, self.standby_marks = self.standby_marks, None  # exact for the first load only
        snap = await self.store.load(mirror)
        read = time.monotonic()
        self.machine.apply(Loaded(snap, at=read))
        logger.info("cache loaded at revision %d: epoch %s, %d done marks%s, %d sessions, %d live "
                    "assignments (etcd read %.2f s, state built %.2f s)", snap.revision, snap.epoch,
                    len(snap.done), " (the standby's mirror)" if snap.mirrored else "",
                    len(snap.trainers), len(snap.assignments), read - started,
                    time.monotonic() - read)

    def schedule_rebuild(self) -> None:
        if self._rebuilding is None or self._rebuilding.done():
            self._rebuilding = asyncio.create_task(self._rebuild(), name="rebuild")

    async def _rebuild(self) -> None:
        self._ready.clear()
        try:
            while True:
                await self._drained.wait()
                try:
                    await self.load()
                    break
                except NotLeader as error:
                    self.depose(error)
                    return
                except Exception as error:
                    logger.warning("rebuild failed (%s); retrying", error)
                    await asyncio.sleep(REBUILD_RETRY)
        finally:
            if not self.deposed.done():
                self._ready.set()

    # ---- faults and background steps ----------------------------------------------------

    def depose(self, error: Exception) -> None:
        if not self.deposed.done():
            self.deposed.set_result(error)

    def on_store_error(self, error: BaseException, *, where: str) -> None:
        if isinstance(error, NotLeader):
            self.depose(error)
        elif isinstance(error, StoreUnanswered):
            # A read or a lease refresh: nothing written, the cache still agrees with etcd.
            # A rebuild would stall every trainer each time etcd drops the lease keeper's
            # stream under load (hundreds of KeepAlives fail at once).
            logger.debug("%s: %s", where, error)
        elif isinstance(error, StoreUnavailable):
            logger.warning("%s: %s; rebuilding the cache from etcd", where, error)
            self.schedule_rebuild()
        else:
            logger.error("%s failed; rebuilding the cache from etcd", where, exc_info=error)
            self.schedule_rebuild()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        """Runs a background step; its failure is handled as a store fault or a bug."""
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, CacheOutOfStep):
            return  # logged, and the rebuild scheduled, at the gate
        if error is not None:
            self.on_store_error(error, where=task.get_name())

    async def stop(self) -> None:
        """Stops serving: calls at the gate or in flight fail with NotLeader."""
        self.depose(NotLeader(None))
        self._ready.set()  # wake the calls waiting at the gate: they see `deposed`
        tasks = [t for t in [*self._background, self._rebuilding] if t is not None]
        await cancel_and_wait(*tasks)
        await self.store.stop()
