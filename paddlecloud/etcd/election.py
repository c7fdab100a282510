"""An `Election`, as in etcd's Go `concurrency` package: campaign on one key with a session's
lease, observe the leader, resign; the won key's creation revision fences every write the
leader makes (`Leadership.fence`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import aetcd
from aetcd import rpc

from paddlecloud.etcd.errors import EtcdUnavailable
from paddlecloud.etcd.session import Session

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Leadership:
    """Proof of a won election: the leader key and its creation revision (the fence)."""

    key: bytes
    create_revision: int

    def fence(self) -> rpc.Compare:
        """A compare that holds only while this leadership stands."""
        return rpc.Compare(
            key=self.key,
            target=rpc.Compare.CREATE,
            result=rpc.Compare.EQUAL,
            create_revision=self.create_revision,
        )


class Election:
    """Campaigns for one key: the winner holds it on its session's lease."""

    def __init__(self, session: Session, key: bytes) -> None:
        self.session = session
        self.key = key

    async def campaign(self, value: str, *, on_leader: Callable[[str, int], None] | None = None,
                       reclaim: Iterable[int] = ()) -> Leadership:
        """Waits until this session holds the key; calls `on_leader(value, term)` with each other
        leader seen, `term` the key's create revision (a campaign started again may see one
        term twice).

        `reclaim`: leases the caller has proved dead or abandoned (a dead predecessor's:
        `master.presence.dead_predecessor`; its own earlier sessions'): the key holding
        `value` on one of them is revoked (once each) instead of waited out."""
        client = self.session.client
        reclaim = set(reclaim)
        while True:
            succeeded, responses = await client.transaction(
                compare=[client.transactions.create(self.key) == 0],
                success=[client.transactions.put(self.key, value.encode(), lease=self.session.lease_id)],
                failure=[client.transactions.get(self.key)],
            )
            if succeeded:
                current = await client.get(self.key)
                if current is not None and current.lease == self.session.lease_id:
                    return Leadership(self.key, current.create_revision)
                continue
            if responses and responses[0]:
                value_now, meta = responses[0][0]
                if meta.lease == self.session.lease_id:  # ours from an earlier attempt
                    return Leadership(self.key, meta.create_revision)
                if meta.lease in reclaim and value_now == value.encode():
                    reclaim.discard(meta.lease)  # once: a lease that will not go is waited out
                    logger.warning("the leader key names this campaigner's own address %s on lease %x, "
                                   "which no live campaigner holds (a dead predecessor's, or an earlier "
                                   "session of this one): revoking it", value, meta.lease)
                    with contextlib.suppress(aetcd.ClientError):  # gone already: no matter
                        await client.revoke_lease(meta.lease)
                    continue
                if on_leader is not None:
                    on_leader(value_now.decode(), meta.create_revision)
                await self._wait_deleted(meta.mod_revision)

    async def _wait_deleted(self, seen_revision: int) -> None:
        client = self.session.client
        watch = await client.watch(self.key, start_revision=seen_revision + 1)
        lost = asyncio.create_task(self.session.lost.wait())
        try:
            async def deleted() -> None:
                async for event in watch:
                    if event.kind == "DELETE":
                        return
            waiter = asyncio.create_task(deleted())
            done, _ = await asyncio.wait({waiter, lost}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if lost in done:
                raise EtcdUnavailable("session lost while waiting for the leader key")
            waiter_exc = None if waiter.cancelled() else waiter.exception()
            if waiter_exc is not None:
                raise waiter_exc
        finally:
            lost.cancel()
            with contextlib.suppress(Exception):
                await watch.cancel()

    async def leader(self) -> str | None:
        current = await self.session.client.get(self.key)
        return current.value.decode() if current is not None else None

    async def resign(self, leadership: Leadership) -> None:
        client = self.session.client
        with contextlib.suppress(Exception):
            await client.transaction(
                compare=[client.transactions.create(self.key) == leadership.create_revision],
                success=[client.transactions.delete(self.key)],
                failure=[],
            )
