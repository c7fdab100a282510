"""The save-model room: one trainer at a time is told to save the model, for `block`
seconds (as the Go master did). The grant lives in etcd on a lease of that length,
so it survives a master failover and lapses on its own. `block` is capped (the task
timeout, or `MAX_BLOCK` when that is off), and the grant dies with its holder's
session: when the session ends (leave, expiry, superseded) the grant is deleted. So
does a RestartEpoch (in its own transaction): the grant was the old group's, whose
holder may have been stopped without leaving. A session that ended while no master
led leaves its grant to lapse with its own lease (at most the cap).

The grant is the machine's (`master.machine`: `SaveModelGranted`, `SaveModelReleased`);
this room subscribes to `SessionEnded` to release the grant of a session that ended.

What this does NOT do: know whether the trainer saved anything.
"""

from __future__ import annotations

import contextlib
import logging
import time

from master.core import Core, InvalidArgument
from master.machine import SaveModelGranted, SaveModelReleased, SessionEnded
from master.trainers import Trainers

logger = logging.getLogger(__name__)

MAX_BLOCK = 3600.0  # seconds a grant may last when the task timeout is off


class SaveModel:
    def __init__(self, core: Core, trainers: Trainers) -> None:
        self.core = core
        self.trainers = trainers
        core.machine.subscribe(self._holder_gone, SessionEnded)

    @property
    def saving(self) -> bool:
        """A grant this master gave is live: a checkpoint is being saved (master.goodput)."""
        return self.core.machine.saving(time.monotonic())

    @property
    def max_block(self) -> float:
        return self.core.policy.task_timeout or MAX_BLOCK

    def _holder_gone(self, _ended: SessionEnded) -> None:
        holder = self.core.machine.orphan_grant
        if holder is not None:
            self.core.spawn(self._release(holder), "release-save-model")

    async def _release(self, holder: str) -> None:
        released = SaveModelReleased(holder)
        if await self.core.commit(released) is None:
            self.core.apply(released)  # etcd holds no grant of `holder` (it lapsed): nor do we

    async def request(self, session: int, block: float) -> bool:
        """True when the caller's trainer holds the grant (now, or already)."""
        if not 0 < block <= self.max_block:
            raise InvalidArgument(f"block {block:g}s must be positive and at most {self.max_block:g}s "
                                  "(the task timeout)")
        store = self.core.store
        async with self.core.admitted():
            info = await self.trainers.touch(session)
            holder = await store.save_model_holder()
            if holder is not None:
                return holder == info.trainer
            lease = await store.leases.grant(block)
            granted = await self.core.commit(
                SaveModelGranted(info.trainer, lease, until=time.monotonic() + block)) is not None
            if not granted:
                with contextlib.suppress(Exception):
                    await store.leases.revoke(lease)
            return granted
