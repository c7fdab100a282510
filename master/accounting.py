"""The goodput room: feeds the master's cache to the `GoodputMeter` once a second and keeps
its figures in etcd, so that every leader of the job goes on from the last (master.goodput).

What this does NOT do: change anything of the job's state, or slow a call: it reads the
cache on the event loop (a few dictionary walks) and writes one key every few seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time

from master.core import Core
from master.goodput import (
    PERSIST_EVERY,
    SAMPLE_EVERY,
    GoodputMeter,
    Observation,
    holding_by_trainer,
    wall_clock,
)
from master.save_model import SaveModel
from master.scaling import Scaling
from master.state import TaskStatus
from master.store_errors import NotLeader

logger = logging.getLogger(__name__)


class Accounting:
    def __init__(self, core: Core, *, scaling: Scaling, save_model: SaveModel) -> None:
        self.core = core
        self.scaling = scaling
        self.save_model = save_model
        self.meter = GoodputMeter(now=time.monotonic())
        self._failed = False

    async def load(self) -> None:
        """Goes on from the figures the job's last leader wrote (the gap counts as failover)."""
        raw = await self.core.store.goodput()
        self.meter = GoodputMeter.from_json(raw, now=time.monotonic(), wall=wall_clock())

    def observe(self) -> Observation:
        core, state = self.core, self.core.state
        holding = holding_by_trainer(core.sessions.by_trainer.items(), state.held if state else {})
        capacity = self.scaling.desired or len(holding)
        if state is None:
            return Observation(capacity=capacity, running=True, has_dataset=False, epoch=0,
                               todo=0, pending=0, holding=holding)
        status = state.status
        credited = self.meter.credited_tasks()
        counts = state.counts
        return Observation(
            capacity=capacity, running=not state.job_over, has_dataset=True, epoch=state.epoch,
            todo=counts[TaskStatus.TODO],
            pending=counts[TaskStatus.PENDING] + counts[TaskStatus.RESERVED],
            holding=holding, saving=self.save_model.saving,
            done=frozenset(t for t in credited if status[t] == TaskStatus.DONE),
            done_count=counts[TaskStatus.DONE], num_tasks=state.units)  # pieces too: a share of the units

    def sample(self) -> None:
        """One look at the cache; a fault here is logged (once a term) and never stops the
        master: goodput is an account of the job, not a part of it."""
        try:
            self.meter.sample(self.observe(), now=time.monotonic())
        except Exception:
            if not self._failed:
                logger.exception("goodput: a sample failed; the figures miss its seconds")
            self._failed = True

    async def run(self) -> None:
        """Samples every SAMPLE_EVERY seconds and writes the figures at once, then every
        PERSIST_EVERY (runs until cancelled at the end of the term, writing them a last time):
        a write at the term's start dates the figures, so a next leader can count the gap."""
        try:
            self.sample()
            await self._write()
            written = time.monotonic()
            while True:
                await asyncio.sleep(SAMPLE_EVERY)
                self.sample()
                if time.monotonic() - written >= PERSIST_EVERY:
                    written = time.monotonic()
                    await self._write()
        finally:
            await asyncio.shield(self._last_write())

    def _figures(self) -> str:
        wall = wall_clock()
        self.meter.mark(wall=wall)
        return self.meter.to_json(wall=wall)

    async def _write(self) -> None:
        try:
            await self.core.store.set_goodput(self._figures())
        except NotLeader:
            raise
        except Exception as error:  # the next write carries them; a new leader counts the gap
            logger.warning("goodput figures not written (the next write carries them): %s", error)

    async def _last_write(self) -> None:
        self.sample()
        try:
            await asyncio.wait_for(self.core.store.set_goodput(self._figures()), 2)
        except Exception as error:
            logger.debug("last goodput figures not written: %s", error)
