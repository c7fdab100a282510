"""The sessions room: trainers register, keep alive, leave, supersede and die.

A session is an etcd lease the master grants and refreshes only when the trainer
calls (`master.sessions`). When a session ends — revoked here (leave, supersede) or
lapsed (seen by the watch of `trainers/<id>` keys) — etcd has already dropped its
`assign/<task>` keys with the lease, so the tasks it held are mirrored back to todo
in the cache (no write, no failure counted).

One exception to "only when the trainer calls": a new session's lease is refreshed every
half TTL after its registration, up to FIRST_CALL_GRACES times, while no call of it was
served. A trainer sends its first GetTask as soon as it registers, but when thousands
register at once that call queues behind the rest of the storm, and without the grace the
first trainers to register lapse before their first call is served and register again,
adding to the storm. Streams make that first round longer still (gRPC takes up one new
stream per turn of the event loop), hence several refreshes, not one
(docs/benchmarks.md, "Scale"). A session that was never served holds no task, so the
refreshes keep no task from coming back; a trainer that died right after registering
counts as alive for up to 3 TTLs instead of one.

A session that lapsed and whose trainer then calls again was alive all along: either the
master served it slower than its TTL (too many sessions for `--session-ttl`: docs/performance.md's
sizing) or the trainer was paused. Each is counted (`paddlecloud_master_sessions_lapsed_alive`)
and, at most once a minute, named in a warning, so an operator sees the master past its
capacity before the re-registrations it causes pile up.

What this does NOT do: keep a lease alive on its own beyond that first-call grace, or touch
a task's state other than by mirroring what a lease took with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass

from master import metrics
from master.core import Core, InvalidArgument, TooSlow
from master.machine import Loaded, SessionCalled, SessionEnded, SessionMarked, SessionOpened
from master.sessions import (
    SessionExpired,
    SessionInfo,
    SessionSuperseded,
    TooManySessions,
    UnknownTrainer,
    session_cap_refusal,
    trainer_base,
)
from master.state import InvalidTransition
from master.store_errors import NotLeader
from paddlecloud.aio import KeyedLocks, cancel_and_wait
from paddlecloud.untrusted import quote
from paddlecloud.wire import short_session

logger = logging.getLogger(__name__)

MAX_TRAINER_ID = 253  # bytes, as a Kubernetes object name
LAPSED_REMEMBERED = 65_536  # lapsed sessions remembered to tell a late call (~100 bytes each)
LAPSED_WARN_EVERY = 60.0  # seconds between warnings about sessions that lapsed alive
FIRST_CALL_GRACES = 4  # refreshes, TTL/2 apart, of a session none of whose calls was served yet
_TRAINER_ID = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._/-]*[A-Za-z0-9])?")


def is_trainer_id(text: str) -> bool:
    """A short name: letters, digits, '.', '_', '-', '/' (a loader worker's `7/0`), starting and
    ending alphanumeric, <= 253 bytes."""
    return len(text) <= MAX_TRAINER_ID and text.isascii() and _TRAINER_ID.fullmatch(text) is not None


def _check_trainer_id(trainer: str) -> None:
    if not is_trainer_id(trainer):
        raise InvalidArgument(
            f"trainer id {quote(trainer)} is not a short name: use 1-{MAX_TRAINER_ID} letters, digits, "
            "'.', '_', '-' or '/', starting and ending with a letter or digit")


@dataclass(frozen=True)
class Registration:
    session: int
    ttl: float
    current_epoch: int
    num_epochs: int


class Trainers:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.registry = core.sessions
        self._ending: set[int] = set()  # sessions this master is revoking right now
        self._registering = KeyedLocks()  # one trainer id's registrations go one at a time
        # registrations under way, by trainer_base (the session cap counts them), and of those
        # the trainers that had no session when they began
        self._opening: Counter[str] = Counter()
        self._new_bases: Counter[str] = Counter()
        self._watch: asyncio.Task[None] | None = None
        self._graces: dict[int, asyncio.TimerHandle] = {}  # new session -> its next refresh, pending
        self._lapsed: OrderedDict[int, None] = OrderedDict()  # sessions ended by expiry, the newest last
        self._lapsed_alive = 0  # of them, called again since the last warning
        self._warned_at = -math.inf
        core.machine.subscribe(self.watch_from, Loaded)

    async def register(self, trainer: str) -> Registration:
        _check_trainer_id(trainer)
        async with self.core.admitted(), self._registering.hold(trainer):
            reserved = self._reserve(trainer)
            try:
                return await self._open(trainer)
            finally:
                self._release(reserved)

    def _reserve(self, trainer: str) -> tuple[str, bool] | None:
        """Checks the session cap (`master.sessions`: one holder of the shared trainer token must
        not hold every task under made-up ids; no range, no cap) and counts `trainer` in it
        while its registration is under way; what `_release` gives back. O(1): a registration
        storm of thousands checks each one in constant time."""
        span = self.core.machine.trainer_range
        if span is None or trainer in self.registry.by_trainer:
            return None  # a known id supersedes its session: it never counts twice
        base = trainer_base(trainer)
        bases = self.registry.bases
        new = base not in bases and base not in self._new_bases
        why = session_cap_refusal(trainer, trainers=len(bases) + len(self._new_bases), new_trainer=new,
                                  sessions_of_trainer=bases.get(base, 0) + self._opening[base],
                                  maximum=span.maximum)
        if why is not None:
            metrics.SESSIONS_CAPPED.inc()
            raise TooManySessions(why)
        self._opening[base] += 1
        if new:
            self._new_bases[base] += 1
        return base, new

    def _release(self, reserved: tuple[str, bool] | None) -> None:
        if reserved is None:
            return
        base, new = reserved
        for counter in (self._opening, self._new_bases) if new else (self._opening,):
            counter[base] -= 1
            if not counter[base]:
                del counter[base]

    async def _open(self, trainer: str) -> Registration:
        core, store = self.core, self.core.store
        lease = await store.leases.grant(core.policy.session_ttl)
        old = self.registry.by_trainer.get(trainer)
        try:
            if old is not None:
                # Before the revoke: a call of the old session in the window until the
                # new one is recorded must hear "superseded" (it stops), not "expired"
                # (it would register again and evict the newer process in turn).
                core.apply(SessionMarked(old, trainer, "superseded"))
                await self._end(old, cause="superseded")
            opened = SessionOpened(trainer, lease, old, at=time.monotonic())
            if await core.commit(opened) is None:
                raise TooSlow(f"the session of trainer {quote(trainer)} lapsed before it was "
                              f"recorded (this master is slower than its {core.policy.session_ttl:g}s "
                              "session TTL): register again")
        except BaseException:
            with contextlib.suppress(Exception):
                await store.leases.revoke(lease)
            raise
        self._grace_later(lease, self.registry.by_session[lease].last_call, FIRST_CALL_GRACES)
        logger.info("trainer %s registered: session %s%s", trainer, short_session(lease),
                    f" (supersedes {short_session(old)})" if old else "")
        state = core.state
        return Registration(
            session=lease, ttl=core.policy.session_ttl,
            current_epoch=state.epoch if state else 0,
            num_epochs=core.spec.num_epochs if core.spec else 0,
        )

    async def evict(self, trainer: str) -> tuple[int, int]:
        """The operator ends `trainer`'s session as a supersede would: its tasks return to todo
        at once (no failure counted) and its next call hears "evicted" (its process stops).
        Returns (the session, the tasks it held). UnknownTrainer when it has no session."""
        _check_trainer_id(trainer)
        async with self.core.admitted(), self._registering.hold(trainer):
            session = self.registry.by_trainer.get(trainer)
            if session is None:
                raise UnknownTrainer(f"trainer {quote(trainer)} has no session: nothing to evict")
            state = self.core.state
            held = len(state.held_by(session)) if state is not None else 0
            self.core.apply(SessionMarked(session, trainer, "evicted"))
            await self._end(session, cause="evicted")
            logger.warning("trainer %s evicted by the operator: session %d ended, %d task(s) back to todo",
                           trainer, session, held)
            return session, held

    async def keep_alive(self, session: int) -> float:
        async with self.core.admitted():
            await self.touch(session, force=True)
            return self.core.policy.session_ttl

    async def keep(self, session: int) -> None:
        """A call of `session` was shed: its trainer is alive, so its lease is refreshed when
        due (unwaited, as any call's), outside the gate: a lease refresh writes no job state.
        Without this a trainer shed, then queued again behind thousands of calls, outlived its
        session. An unknown or superseded session is left alone (its next call hears why)."""
        with contextlib.suppress(SessionExpired, SessionSuperseded):
            await self._refresh(session)

    async def _refresh(self, session: int, *, force: bool = False) -> SessionInfo:
        """Records the call, and refreshes the session's lease when due (always when `force`,
        else once its last refresh is ttl/6 old); SessionExpired when it had lapsed."""
        info = self.registry.check(session)
        now = time.monotonic()
        due = force or now - info.last_refresh >= self.core.policy.session_ttl / 6
        self.core.apply(SessionCalled(session, now, due))
        if due:
            metrics.LEASE_REFRESHES.inc()
            if await self.core.store.leases.refresh(session, wait=force) <= 0:
                raise SessionExpired(session)
        return info

    def _grace_later(self, session: int, registered: float, left: int) -> None:
        self._graces[session] = asyncio.get_running_loop().call_later(
            self.core.policy.session_ttl / 2, self._first_call_grace, session, registered, left)

    def _first_call_grace(self, session: int, registered: float, left: int) -> None:
        """Refreshes a new session's lease (unwaited) unless one of its calls was served."""
        self._graces.pop(session, None)
        info = self.registry.by_session.get(session)
        if info is None or info.last_call != registered:
            return
        self.core.spawn(self.core.store.leases.refresh(session, wait=False), "first-call-grace")
        if left > 1:
            self._grace_later(session, registered, left - 1)

    async def leave(self, session: int) -> None:
        async with self.core.admitted():
            if session in self.registry.by_session:
                await self._end(session, cause="leave")

    async def touch(self, session: int, *, force: bool = False) -> SessionInfo:
        """The trainer called: refresh its lease (always when `force`, else throttled).

        Raises SessionExpired (the session is then ended here too) or SessionSuperseded,
        but only once this master made sure it still leads: a paused, deposed leader
        would not know the sessions opened since.
        """
        try:
            return await self._refresh(session, force=force)
        except (SessionExpired, SessionSuperseded) as error:
            try:
                await self.core.store.confirm_leadership()
            except NotLeader as deposed:
                self.core.depose(deposed)
                raise
            if isinstance(error, SessionExpired):
                self.gone(session, cause="expiry")
                self._called_after_lapse(session)
            raise

    def _called_after_lapse(self, session: int) -> None:
        """`session` is expired; if it lapsed under this master, its trainer was alive."""
        if session not in self._lapsed:
            return
        del self._lapsed[session]  # counted once: the trainer registers again now
        metrics.LAPSED_ALIVE.inc()
        self._lapsed_alive += 1
        now = time.monotonic()
        if now - self._warned_at >= LAPSED_WARN_EVERY:
            logger.warning(
                "%d session(s) lapsed although their trainers still called: this master served them "
                "slower than --session-ttl %gs (%d sessions now; idle trainers ask 3 x sessions / TTL "
                "KeepAlives a second: see docs/performance.md), or those trainers were paused",
                self._lapsed_alive, self.core.policy.session_ttl, len(self.registry.by_session))
            self._warned_at, self._lapsed_alive = now, 0

    async def _end(self, session: int, *, cause: str) -> None:
        self._ending.add(session)  # the watch sees the lease go first: let the cause be ours
        try:
            await self.core.store.leases.revoke(session)
            self.gone(session, cause=cause)
        finally:
            self._ending.discard(session)

    def gone(self, session: int, *, cause: str) -> None:
        """The session's lease is gone, so are its assignments in etcd: mirror that.

        A task with a write in flight is left to that write: etcd refuses it now, and
        its refusal releases the task (`master.tasks`).
        """
        grace = self._graces.pop(session, None)
        if grace is not None:
            grace.cancel()
        info = self.registry.by_session.get(session)
        released = self.core.machine.releasable(session)
        self.core.apply(SessionEnded(session, cause))
        if info is None:
            return
        if cause == "expiry":
            self._lapsed[session] = None
            if len(self._lapsed) > LAPSED_REMEMBERED:
                self._lapsed.popitem(last=False)
        for _ in released:
            self.core.count_requeue(cause)
        logger.info("session %s of trainer %s ended (%s)", short_session(session), info.trainer, cause)

    # ---- the watch of trainer keys --------------------------------------------------

    def watch_from(self, loaded: Loaded) -> None:
        """(Re)starts the watch just after the snapshot the cache was loaded from."""
        if self._watch is not None:
            self._watch.cancel()
        self._watch = asyncio.create_task(self._watch_ended(loaded.snapshot.revision + 1),
                                          name="watch-sessions")

    async def _watch_ended(self, start_revision: int) -> None:
        """etcd deletes `trainers/<id>` when a lease lapses: that is how a dead trainer is seen."""
        try:
            async for session in self.core.store.ended_sessions(start_revision):
                if session in self.registry.by_session and session not in self._ending:
                    self.gone(session, cause="expiry")
        except asyncio.CancelledError:
            raise
        except InvalidTransition:
            logger.exception("an ended session did not fit the cache; rebuilding it from etcd")
            self.core.schedule_rebuild()
        except Exception as error:
            logger.warning("session watch broke (%s); rebuilding", error)
            self.core.schedule_rebuild()

    async def stop(self) -> None:
        for grace in self._graces.values():
            grace.cancel()
        self._graces.clear()
        await cancel_and_wait(self._watch)
