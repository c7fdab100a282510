"""The fit-a-line model's lineage: which records went into the final model, per epoch.

The example (`examples/fit_a_line/train.py --consumed-log`) appends one JSON line per
training step a trainer took a batch in (`{"step", "rank", "epoch", "ids"}`) and one
`{"resumed": step}` each time a trainer started from a checkpoint. A group restart
undoes every step after the checkpoint it resumes from: the lineage is the log with
those steps dropped. Exact resume means each epoch's lineage is the epoch's records
once each; `record_ids` computes them from the data, independently of the example.

Used by tests/test_resume_paddle.py and the chaos harness's collective runs (one copy).
What this does NOT check: that the model's weights reflect the lineage (only that the
steps the log keeps are the ones a restart did not undo).
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from examples.fit_a_line.consumed import read_entries

logger = logging.getLogger(__name__)


def record_ids(data: Path) -> Counter[int]:
    """The example's `record_id` of every line of the data's CSV files (computed here, independently)."""
    ids: Counter[int] = Counter()
    for path in sorted(data.rglob("*.csv")):
        for line in path.read_text().splitlines():
            if line.strip():
                ids[int.from_bytes(hashlib.blake2b(line.strip().encode(), digest_size=8).digest(),
                                   "big") >> 2] += 1
    return ids


def lineage(log: Path) -> dict[int, Counter[int]]:
    """Per epoch, the records in the final model's lineage (steps undone by restarts dropped)."""
    steps: dict[int, list[dict]] = defaultdict(list)
    for entry in read_entries(log):
        if "resumed" in entry:
            for step in [s for s in steps if s > entry["resumed"]]:
                del steps[step]
        elif "ids" in entry:
            steps[entry["step"]].append(entry)
    consumed: dict[int, Counter[int]] = defaultdict(Counter)
    for entries in steps.values():
        for entry in entries:
            consumed[entry["epoch"]].update(entry["ids"])
    return consumed


@dataclass(frozen=True)
class EpochLineage:
    """One epoch's lineage against the data: records in it more than once, and never."""

    epoch: int
    seen_twice: int   # records in the lineage more than once (each counted once)
    never_seen: int   # records of the data not in the lineage
    unknown: int      # ids in the lineage that are no record of the data


def audit_lineage(consumed: dict[int, Counter[int]], expected: Counter[int], *,
                  epochs: int) -> list[EpochLineage]:
    """Each of epochs 0..epochs-1 against `expected` (every record once): what differs."""
    result = []
    for epoch in range(epochs):
        ids = consumed.get(epoch, Counter())
        result.append(EpochLineage(
            epoch=epoch,
            seen_twice=sum(1 for i, n in ids.items() if n > 1 and i in expected),
            never_seen=sum(1 for i in expected if i not in ids),
            unknown=sum(1 for i in ids if i not in expected)))
    return result


def off_by_epoch(log: Path, data: Path) -> dict[int, str]:
    """Per epoch of the log's lineage whose records are not the data's once each: what is
    wrong ({} when every epoch holds every record exactly once)."""
    expected = record_ids(data)
    wrong = {}
    for epoch, ids in lineage(log).items():
        extra, missing = ids - expected, expected - ids
        if extra or missing:
            wrong[epoch] = (f"{sum(extra.values())} records twice or unknown, "
                            f"{sum(missing.values())} never consumed")
    return wrong
