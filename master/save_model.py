"""The save-model room: one trainer at a time is told to save the model, for `block`
seconds (as the Go master did). The grant lives in etcd on a lease of that length,
so it survives a master failover and lapses on its own.

What this does NOT do: know whether the trainer saved anything.
"""

from __future__ import annotations

import contextlib
import logging

from master.core import Core, InvalidArgument
from master.trainers import Trainers

logger = logging.getLogger(__name__)


class SaveModel:
    def __init__(self, core: Core, trainers: Trainers) -> None:
        self.core = core
        self.trainers = trainers

    async def request(self, session: int, block: float) -> bool:
        """True when the caller's trainer holds the grant (now, or already)."""
        if block <= 0:
            raise InvalidArgument(f"block {block:g}s must be positive")
        store = self.core.store
        async with self.core.admitted():
            info = await self.trainers.touch(session)
            holder = await store.save_model_holder()
            if holder is not None:
                return holder == info.trainer
            lease = await store.grant_lease(block)
            granted = await store.grant_save_model(info.trainer, lease)
            if not granted:
                with contextlib.suppress(Exception):
                    await store.revoke_lease(lease)
            return granted
