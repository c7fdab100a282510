"""The example's ``--consumed-log``: one JSON line per step, appended by every trainer.

Written and read here, in one place: the benchmarks and the tests read it while the
trainers still append to it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class ConsumedLog:
    """The ``--consumed-log`` file: appended lines, each one write (O_APPEND keeps them whole)."""

    def __init__(self, path: str | None, rank: str) -> None:
        self.rank = int(rank)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if path else None

    def write(self, **entry: object) -> None:
        if self._fd is not None:
            os.write(self._fd, (json.dumps(entry) + "\n").encode())


def read_entries(path: Path) -> list[dict]:
    """Every complete line of the log, in order; none when it does not exist yet. A line
    still being appended (no newline yet) is left out: a reader may catch a write halfway."""
    if not path.exists():
        return []
    *complete, _partial = path.read_text().split("\n")
    return [json.loads(line) for line in complete if line]
