"""A trainer's session at the master (`RegisterTrainer`), and the task that keeps it alive.

`run(call)` awaits `call(session_id)`, registering first when there is no session and
again when the master says it expired (SESSION_EXPIRED, up to EXPIRED_RETRIES times in
one call: a session can lapse again before the retry lands, after a pause or a failover);
once the master says it was superseded (SESSION_SUPERSEDED: another process registered
the same trainer id) every `run` raises `TrainerSuperseded`. One registration at a time:
callers that hear SESSION_EXPIRED together register once and share the new id.

The keep-alive task starts with the first registration and stops at `close()`. It calls
`KeepAlive` only when no call through `run` was answered for ttl/3 (any call carrying the
session refreshes it at the master) and none is under way: a call under way refreshes the
session when the master takes it up, and a KeepAlive sent meanwhile would pass the same
gate after it; under load (calls queued at the master for longer than ttl/3) such
KeepAlives would only lengthen the queue that delays them.

The steps of `run` (`ensure`, `begin`, `answered`, `end`, `judge`, `renew`) are public so
that `trainer_agent.client`'s synchronous facade runs a call of the caller's thread
between them; the counters they touch are guarded by a small lock for that reason.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from paddlecloud.api import pb
from paddlecloud.master_client.connection import MasterConnection, reason_of
from paddlecloud.wire import Reason, seconds, short_session

logger = logging.getLogger(__name__)

BEAT_RECHECK = 1.0  # seconds between looks at a session whose call is under way
EXPIRED_RETRIES = 3  # registrations again within one call whose session keeps expiring

T = TypeVar("T")


class TrainerSuperseded(RuntimeError):
    """Another process registered the same trainer id: this one must stop."""


class Session:
    """One trainer id's session; see the module docstring. `on_register(reply)` runs after each
    registration, before any caller gets the new id."""

    def __init__(self, connection: MasterConnection, *, trainer_id: str,
                 on_register: Callable[[pb.RegisterTrainerResponse], None] | None = None) -> None:
        self.connection = connection
        self.trainer_id = trainer_id
        self._on_register = on_register
        self._registering = asyncio.Lock()
        self._counters = threading.Lock()  # `_last_call`, `_under_way`: see the module docstring
        self._id = 0
        self._ttl = 10.0
        self._superseded: TrainerSuperseded | None = None
        self._last_call = 0.0   # monotonic time the last answered call carrying the session was sent
        self._last_beat = 0.0   # ... the keep-alive task last tried a KeepAlive
        self._under_way = 0     # calls through `run` sent and not yet answered (or failed)
        self.keepalives = 0     # KeepAlive calls sent
        self.reregistrations = 0  # how often an expired session was registered again
        self._closed = False
        self._keepalive: asyncio.Task | None = None
        # sees each KeepAlive answer, on the loop (work stealing's split requests ride on them)
        self.on_keep_alive: Callable[[pb.KeepAliveResponse], None] | None = None
        self._split_poll = 0.0  # the master's `split_poll`: KeepAlive this often (0: ttl/3)

    @property
    def id(self) -> int:
        """The session id; 0 before the first registration."""
        return self._id

    @property
    def active(self) -> bool:
        """Registered and not superseded."""
        return bool(self._id) and self._superseded is None

    async def register(self) -> pb.RegisterTrainerResponse:
        """Registers a new session now (the master drops an older one of this trainer id)."""
        async with self._registering:
            return await self._register()

    async def _register(self) -> pb.RegisterTrainerResponse:
        sent = time.monotonic()
        reply = await self.connection.register_trainer(self.trainer_id)
        self._id = reply.session_id
        with self._counters:
            self._last_call = max(self._last_call, sent)
        self._ttl = seconds(reply.ttl) or 10.0
        if self._on_register is not None:
            self._on_register(reply)
        if self._keepalive is None and not self._closed:
            self._keepalive = asyncio.get_running_loop().create_task(self._keep_alive())
        # the master logs each registration (once: not here too, where a local job's console
        # showed every one twice)
        logger.debug("trainer %s registered (session %s, epoch %d)", self.trainer_id,
                     short_session(reply.session_id), reply.current_epoch)
        return reply

    async def ensure(self) -> int:
        """The session id, registering first when there is no session."""
        if self._superseded is not None:
            raise self._superseded
        if not self._id:
            async with self._registering:
                if not self._id:
                    await self._register()
        return self._id

    async def run(self, call: Callable[[int], Awaitable[T]]) -> T:
        """`await call(session_id)`, registering again when the session expired meanwhile."""
        for attempt in range(EXPIRED_RETRIES + 1):
            session = await self.ensure()
            sent = self.begin()
            try:
                result = await call(session)
                self.answered(sent)
                return result
            except grpc.RpcError as error:
                self.judge(session, error, attempt)
            finally:
                self.end()
            await self.renew(session)
        raise AssertionError("unreachable")

    # ---- the steps of `run` -------------------------------------------------------------

    def begin(self) -> float:
        """A call carrying the session is under way; returns when it was sent."""
        with self._counters:
            self._under_way += 1
        return time.monotonic()

    def end(self) -> None:
        with self._counters:
            self._under_way -= 1

    def answered(self, sent: float) -> None:
        with self._counters:
            self._last_call = max(self._last_call, sent)

    def judge(self, session: int, error: grpc.RpcError, attempt: int) -> None:
        """Raises what a failed call of `session` means, unless it means register again
        (SESSION_EXPIRED, within EXPIRED_RETRIES)."""
        reason, metadata = reason_of(error)
        if reason is Reason.SESSION_SUPERSEDED:
            self._superseded = TrainerSuperseded(
                f"trainer {self.trainer_id}: session {session} superseded by a newer session of "
                f"trainer {metadata.get('trainer', self.trainer_id)}; another process uses this trainer id")
            raise self._superseded from None
        if reason is not Reason.SESSION_EXPIRED or attempt == EXPIRED_RETRIES:
            raise error

    async def renew(self, expired: int) -> None:
        """Registers again after `expired` lapsed, unless another caller already did."""
        async with self._registering:
            if self._id == expired:
                logger.warning("session %s expired; registering again", short_session(expired))
                self.reregistrations += 1
                await self._register()

    # ---- leaving and keeping alive -------------------------------------------------------

    async def leave(self, *, timeout: float = 5.0) -> None:
        """Ends the session at the master (its tasks return at once)."""
        if self._id:
            await self.connection.leave_trainer(self._id, timeout=timeout)

    def close(self) -> None:
        """Stops the keep-alive task: it starts no call after this. Call it on the loop."""
        self._closed = True
        if self._keepalive is not None:
            self._keepalive.cancel()

    def beat_every(self, interval: float) -> None:
        """KeepAlive at least this often (the master's `split_poll` at an epoch's tail: its
        answers bring work stealing's split requests); 0: every ttl/3, as usual."""
        with self._counters:
            self._split_poll = interval

    @property
    def beat_interval(self) -> float:
        """Seconds between KeepAlives when no other call carries the session."""
        with self._counters:
            return min(self._ttl / 3, self._split_poll or self._ttl)

    def _next_beat(self) -> float:
        """Seconds until a KeepAlive is due: ttl/3 (or sooner, `beat_every`) after the last
        answered call (or try); while a call is under way, none is due (looked at again in
        BEAT_RECHECK seconds)."""
        with self._counters:
            if self._under_way:
                return min(BEAT_RECHECK, self._ttl / 30)
            interval = min(self._ttl / 3, self._split_poll or self._ttl)  # as `beat_interval`
            return max(self._last_call, self._last_beat) + interval - time.monotonic()

    async def _keep_alive(self) -> None:
        while not self._closed:
            # looked at again at least every BEAT_RECHECK seconds: `beat_every` may shorten it
            await asyncio.sleep(min(BEAT_RECHECK, max(0.0, self._next_beat())))
            if self._closed or self._next_beat() > 0:
                continue  # not due yet: a call carrying the session went out meanwhile
            self._last_beat = time.monotonic()
            self.keepalives += 1
            try:
                reply = await self.run(self.connection.keep_alive)
                if self.on_keep_alive is not None and reply is not None:
                    self.on_keep_alive(reply)
            except TrainerSuperseded:
                return
            except Exception as error:  # the caller's next call meets the same problem
                if not self._closed:
                    logger.warning("keep-alive failed: %s", error)
