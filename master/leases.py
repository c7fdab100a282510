"""The trainers' leases: a session is an etcd lease the master grants, refreshes when its
trainer calls, and revokes when the session ends (docs/design.md section 6).

Refreshes go through a keeper (`paddlecloud.lease_process`, a process of the master's
own, or `paddlecloud.etcd.LeaseKeeper` on this loop), for a master busy with thousands
of trainers turns its loop too slowly to keep their streams moving. A lease call writes
no job state: etcd not answering one is `StoreUnanswered` (the cache stands).

What this does NOT do: decide when a lease is due (`master.trainers` does), or write
the keys put on a lease (`master.transactions`).
"""

from __future__ import annotations

import contextlib
import math

import aetcd

from master.store_errors import etcd_answers
from paddlecloud.etcd import LeaseKeeper


class TrainerLeases:
    def __init__(self, client: aetcd.Client, keeper: LeaseKeeper | None = None) -> None:
        self.client = client
        # closed here only when made here; a lease process is closed by whoever gave it
        self._own_keeper = keeper is None
        self.keeper = keeper if keeper is not None else LeaseKeeper(client)

    def start(self) -> None:
        self.keeper.start()  # the lease process starts while the cache loads, not at the first KeepAlive

    async def stop(self) -> None:
        if self._own_keeper:
            await self.keeper.close()

    async def grant(self, ttl: float) -> int:
        """A new lease of `ttl` seconds (at least 1); its id."""
        with etcd_answers("a lease grant"):
            return (await self.client.lease(max(1, round(ttl)))).id

    async def revoke(self, lease: int) -> None:
        """Revokes `lease` (its keys go with it); a lease already gone is no error."""
        with contextlib.suppress(aetcd.ClientError):
            await self.client.revoke_lease(lease)

    async def refresh(self, lease: int, *, wait: bool = True) -> float:
        """Refreshes `lease`; its remaining TTL, <= 0 when it had lapsed. Without `wait`
        the refresh is only sent, and the answer is `inf` (not known, not waited for)."""
        if not wait:
            self.keeper.refresh_soon(lease)
            return math.inf
        with etcd_answers("a lease refresh"):
            return await self.keeper.refresh(lease)
