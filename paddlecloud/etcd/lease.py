"""Keeping many leases alive over one stream, as the master does for its trainers' sessions.

`LeaseKeeper` does not decide which leases live: its callers ask for each refresh (a
trainer's lease is refreshed only when the trainer calls, see `master.sessions`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import aetcd
from aetcd import rpc

from paddlecloud.aio import cancel_and_wait
from paddlecloud.etcd.client import RPC_TIMEOUT
from paddlecloud.etcd.errors import EtcdUnavailable

logger = logging.getLogger(__name__)


class LeaseKeeper:
    """Refreshes leases over one long-lived LeaseKeepAlive stream.

    aetcd opens a new stream per refresh; a master refreshing many trainer leases
    would pay a stream set-up each time, so this multiplexes them on one stream.
    `refresh(lease)` returns the remaining TTL, 0 when the lease is gone (an answer for
    the lease answers every caller waiting on it: a refresh is a refresh);
    `refresh_soon(lease)` only queues the request (no future, no wait): for a refresh
    whose answer nobody needs, e.g. one piggybacked on a trainer's call.

    A stream that breaks is opened again at once (then after 0.1 s doubling to 2 s while it
    keeps breaking), and every lease asked for and not yet answered is asked again on it:
    a refresh is idempotent. etcd under a burst of writes ends the stream now and then
    ("waiting for the applied index took too long"): its leader renews a lease only once
    it has applied every committed entry, waits at most a second for that, and ends the
    whole LeaseKeepAlive stream with that error. Dropping the refreshes queued on it would
    let every session waiting on them lapse together. A caller of `refresh` still waits no
    longer than its timeout.
    """

    def __init__(self, client: aetcd.Client, *,
                 on_answer: Callable[[int, int], None] | None = None) -> None:
        self._client = client
        self._on_answer = on_answer  # called with (lease, TTL) for every answer
        self._requests: asyncio.Queue[int] = asyncio.Queue()
        self._waiters: dict[int, list[asyncio.Future[int]]] = {}
        self._unanswered: dict[int, None] = {}  # leases asked for on the stream, in order
        self._served = False  # the current stream answered something (it was not a failed open)
        self._reader: asyncio.Task[None] | None = None

    async def refresh(self, lease_id: int, *, timeout: float = RPC_TIMEOUT) -> int:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(lease_id, []).append(future)
        self.refresh_soon(lease_id)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            raise EtcdUnavailable(f"etcd did not refresh lease {lease_id:x} in {timeout:g}s") from None
        finally:
            waiters = self._waiters.get(lease_id)
            if waiters is not None:
                with contextlib.suppress(ValueError):
                    waiters.remove(future)
                if not waiters:
                    del self._waiters[lease_id]

    def refresh_soon(self, lease_id: int) -> None:
        self.start()
        self._unanswered[lease_id] = None
        self._requests.put_nowait(lease_id)

    def start(self) -> None:
        """Opens the stream now rather than at the first refresh (which would wait for it)."""
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._run(), name="lease-keeper")

    @staticmethod
    async def _requests_of(queue: asyncio.Queue[int]):
        while True:  # bound to one stream's queue: a broken stream's iterator takes no more
            yield rpc.LeaseKeepAliveRequest(ID=await queue.get())

    async def _run(self) -> None:
        delay = 0.0
        while True:
            if delay:
                await asyncio.sleep(delay)
            self._requests = asyncio.Queue()
            for lease in self._unanswered:  # asked for on the stream that broke: ask again
                self._requests.put_nowait(lease)
            self._served = False
            try:
                await self._stream(self._requests)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                # once per outage: while etcd stays away the stream breaks every 2 s
                logger.log(logging.DEBUG if delay else logging.WARNING,
                           "lease keep-alive stream broke (%s); asking again for the %d "
                           "lease(s) it had not answered", error, len(self._unanswered))
            delay = 0.0 if self._served else min(max(2 * delay, 0.1), 2.0)

    async def _stream(self, queue: asyncio.Queue[int]) -> None:
        """Serves one stream until it ends."""
        await self._client.connect()
        stream = self._client.leasestub.LeaseKeepAlive(self._requests_of(queue),
                                                       metadata=self._client.metadata)
        async for reply in stream:
            self._answered(reply.ID, reply.TTL)

    def _answered(self, lease: int, ttl: int) -> None:
        self._served = True
        self._unanswered.pop(lease, None)
        for future in self._waiters.pop(lease, ()):
            if not future.done():
                future.set_result(ttl)
        if self._on_answer is not None:
            self._on_answer(lease, ttl)

    async def close(self) -> None:
        await cancel_and_wait(self._reader)
        self._reader = None
        self._unanswered.clear()
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_exception(EtcdUnavailable("lease keeper closed"))
        self._waiters.clear()
