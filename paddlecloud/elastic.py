"""A job's trainer range: `min_trainers <= desired <= max_trainers` (docs/design.md section 11).

One small value shared by the CLIs, the job spec, the master (which keeps it in
etcd under the job's `trainers-range` and `trainers-desired` keys) and both
deployers. A fixed job has min = max = desired.

What this does NOT do: decide when to scale (a user, a schedule or an autoscaler
does), nor converge to the size (the deployers do).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from paddlecloud.units import parse_duration

logger = logging.getLogger(__name__)


class RangeError(ValueError):
    """A trainer count or range that cannot be: the message names the value and the range."""


@dataclass(frozen=True)
class TrainerRange:
    minimum: int
    maximum: int

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.maximum:
            raise RangeError(f"trainer range {self.minimum}..{self.maximum}: need "
                             "1 <= min_trainers <= max_trainers")

    @classmethod
    def fixed(cls, trainers: int) -> TrainerRange:
        return cls(trainers, trainers)

    @classmethod
    def of(cls, *, trainers: int | None, minimum: int | None, maximum: int | None) -> tuple[TrainerRange, int]:
        """The range and the desired size at start from `--trainers`, `--min/--max-trainers`.

        A bound not given is `trainers` (kept within the other bound); `trainers` not
        given is the maximum (an elastic job starts as large as it may).
        """
        size = trainers if trainers is not None else (maximum or minimum or 1)
        low = minimum if minimum is not None else min(size, maximum or size)
        high = maximum if maximum is not None else max(size, minimum or size)
        span = cls(low, high)
        desired = trainers if trainers is not None else span.maximum
        span.check(desired)
        return span, desired

    @property
    def elastic(self) -> bool:
        return self.minimum < self.maximum

    def check(self, trainers: int) -> int:
        """`trainers` if it lies in the range; else a RangeError naming both."""
        if not self.minimum <= trainers <= self.maximum:
            raise RangeError(f"{trainers} trainers is outside the job's range "
                             f"{self.minimum}..{self.maximum} (min_trainers..max_trainers)")
        return trainers

    def to_json(self) -> str:
        return json.dumps({"min": self.minimum, "max": self.maximum})

    @classmethod
    def from_json(cls, text: str | bytes) -> TrainerRange:
        raw = json.loads(text)
        return cls(int(raw["min"]), int(raw["max"]))

    def __str__(self) -> str:
        return f"{self.minimum}..{self.maximum}"


def parse_schedule(text: str) -> tuple[tuple[float, int], ...]:
    """`2@0s,4@20s,1@40s` -> ((0.0, 2), (20.0, 4), (40.0, 1)): sizes at times since the job
    started, in order (the EDL demo's job server changing the pod count on a timer)."""
    steps: list[tuple[float, int]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        size, at, when = part.partition("@")
        try:
            if not at:
                raise ValueError
            step = (parse_duration(when), int(size))
        except ValueError:
            raise RangeError(f"resize step {part[:40]!r}: write SIZE@TIME, e.g. 4@20s") from None
        if step[1] < 1:
            raise RangeError(f"resize step {part[:40]!r}: the size must be at least 1")
        if steps and step[0] < steps[-1][0]:
            raise RangeError(f"resize step {part[:40]!r} comes before the step ahead of it")
        steps.append(step)
    if not steps:
        raise RangeError(f"resize schedule {text[:40]!r} has no step: write e.g. 2@0s,4@20s")
    return tuple(steps)
