"""The scaling room: the job's trainer range and desired size, in etcd (docs/design.md §11).

The range is written once (from the master's flags, or its job spec on Kubernetes)
and etcd wins over the flags afterwards, as it does for the dataset; the desired
size changes with `ScaleTrainers`, always within the range, by a fenced write that
also compares the range; each change counts one resize (`metrics.RESIZES`, plotted by
the status page), a refused or unchanged size none. The deployer (`master.deployment`, or the local job
through GetStatus) reads the desired size and converges to it.

The range and the size are the machine's (`master.machine`: `TrainerRangeSet`,
`TrainersScaled`), loaded with the rest of the job's keys.

What this does NOT do: start or stop a trainer (the deployer does), nor count the
live trainers (the sessions are that count).
"""

from __future__ import annotations

import logging

from master import metrics
from master.core import Core, FailedPrecondition, InvalidArgument
from master.machine import TrainerRangeSet, TrainersScaled
from paddlecloud.elastic import RangeError, TrainerRange

logger = logging.getLogger(__name__)


class Scaling:
    def __init__(self, core: Core) -> None:
        self.core = core

    @property
    def span(self) -> TrainerRange | None:
        return self.core.machine.trainer_range

    @property
    def desired(self) -> int:
        return self.core.machine.trainers_desired

    async def load(self, configured: tuple[TrainerRange, int] | None) -> None:
        """Writes `configured` when the job has no range in etcd (the machine was loaded
        from it); else warns when the flags give another range: etcd's stands."""
        if self.span is None and configured is not None:
            if await self.core.commit(TrainerRangeSet(*configured)) is None:
                await self.core.load()  # another master wrote one first: etcd's stands
        if configured is not None and self.span is not None and configured[0] != self.span:
            logger.warning("the job's trainer range in etcd is %s; the flags give %s: etcd's stands",
                           self.span, configured[0])

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
            before = self.desired
            if trainers != before:
                if await self.core.commit(TrainersScaled(span, trainers)) is None:
                    raise FailedPrecondition(f"the trainer range in etcd is no longer {span}: retry")
                logger.info("desired trainers: %d -> %d (range %s)", before, trainers, span)
                metrics.RESIZES.labels("up" if trainers > before else "down").inc()
            return span, self.desired
