"""The scaling room: the job's trainer range and desired size, in etcd (docs/design.md §11).

The range is written once (from the master's flags, or its job spec on Kubernetes)
and etcd wins over the flags afterwards, as it does for the dataset; the desired
size changes with `ScaleTrainers`, always within the range, by a fenced write that
also compares the range; each change counts one resize (`metrics.RESIZES`, plotted by
the status page), a refused or unchanged size none. The deployer (`master.deployment`, or the local job
through GetStatus) reads the desired size and converges to it.

What this does NOT do: start or stop a trainer (the deployer does), nor count the
live trainers (the sessions are that count).
"""

from __future__ import annotations

import logging

from master import metrics
from master.core import Core, FailedPrecondition, InvalidArgument
from paddlecloud.elastic import RangeError, TrainerRange

logger = logging.getLogger(__name__)


class Scaling:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.span: TrainerRange | None = None
        self.desired = 0

    async def load(self, configured: tuple[TrainerRange, int] | None) -> None:
        """Reads the range from etcd; writes `configured` first when the job has none."""
        store = self.core.store
        found = await store.trainer_size()
        if found is None and configured is not None:
            await store.init_trainer_size(*configured)
            found = await store.trainer_size()
        if found is None:
            return
        if configured is not None and configured[0] != found[0]:
            logger.warning("the job's trainer range in etcd is %s; the flags give %s: etcd's stands",
                           found[0], configured[0])
        self.span, self.desired = found

    async def scale(self, trainers: int) -> tuple[TrainerRange, int]:
        """Records `trainers` as the desired size; refuses a size outside the range, naming both."""
        async with self.core.admitted():
            span = self.span
            if span is None:
                raise FailedPrecondition("the job has no trainer range: its master was started "
                                         "without one (--trainers or --min-trainers/--max-trainers)")
            try:
                span.check(trainers)
            except RangeError as error:
                raise InvalidArgument(str(error)) from None
            if trainers != self.desired:
                if not await self.core.store.set_trainers_desired(trainers, span=span):
                    raise FailedPrecondition(f"the trainer range in etcd is no longer {span}: retry")
                logger.info("desired trainers: %d -> %d (range %s)", self.desired, trainers, span)
                metrics.RESIZES.labels("up" if trainers > self.desired else "down").inc()
                self.desired = trainers
            return span, self.desired
