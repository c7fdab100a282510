"""A `Session`, as in etcd's Go `concurrency` package: a lease and the loop that keeps it
alive, and an event set when it is lost (everything bound to it is gone then)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aetcd

from paddlecloud.aio import cancel_and_wait
from paddlecloud.etcd.errors import EtcdUnavailable
from paddlecloud.etcd.lease import LeaseKeeper

logger = logging.getLogger(__name__)

MIN_LEASE_TTL = 2.0  # seconds; etcd grants no shorter lease (a session's or an election's)


class Session:
    """A lease of `ttl` seconds and the loop that keeps it alive every ttl/3.

    `lost` is set when the lease can no longer be kept (expired, revoked, or etcd
    unreachable past the TTL): everything bound to it must be considered gone.
    """

    def __init__(self, client: aetcd.Client, *, ttl: float) -> None:
        self.client = client
        self.ttl = max(1, round(ttl))
        self.lease_id = 0
        self.lost = asyncio.Event()
        self._keeper = LeaseKeeper(client)
        self._loop_task: asyncio.Task[None] | None = None

    async def open(self) -> Session:
        lease = await self.client.lease(self.ttl)
        self.lease_id = lease.id
        self._loop_task = asyncio.create_task(self._keep_alive(), name=f"session-{lease.id:x}")
        return self

    async def _keep_alive(self) -> None:
        loop = asyncio.get_running_loop()
        expires = loop.time() + self.ttl
        try:
            while True:
                await asyncio.sleep(self.ttl / 3)
                try:
                    remaining = await self._keeper.refresh(self.lease_id, timeout=self.ttl / 3)
                except EtcdUnavailable as error:
                    if loop.time() >= expires:
                        logger.warning("session %x lost: %s", self.lease_id, error)
                        break
                    continue
                if remaining <= 0:
                    logger.warning("session %x expired", self.lease_id)
                    break
                expires = loop.time() + remaining
        finally:
            self.lost.set()

    async def close(self, *, revoke: bool = True) -> None:
        """Stops the keep-alive loop and, unless the lease is already lost, revokes it so
        every key on it goes at once."""
        was_lost = self.lost.is_set()  # the loop sets `lost` when cancelled: look first
        await cancel_and_wait(self._loop_task)
        await self._keeper.close()
        if revoke and self.lease_id and not was_lost:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.client.revoke_lease(self.lease_id), 2)
        self.lost.set()
