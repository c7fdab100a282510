"""What a local job's console leaves out of its children's output (their logs keep all of it).

PaddlePaddle's `paddle.distributed.init_parallel_env()` writes a "Modified FLAGS
detected" banner to stderr on every trainer start, whatever the environment says (so
the trainer launcher's quiet defaults cannot turn it off): three lines or more per
trainer and restart, about flags Paddle set itself. The console drops the banner; the
trainer's log file under OUTPUT/logs keeps every line.
"""

from __future__ import annotations

BANNER_START = "Modified FLAGS detected"


class PaddleBanner:
    """Follows one child's lines: `keep(line)` is False for the lines of Paddle's banner."""

    def __init__(self) -> None:
        self._inside = False

    def keep(self, line: str) -> bool:
        text = line.strip()
        if self._inside:
            if text.startswith("FLAGS("):
                return False
            self._inside = False
            if text and set(text) == {"="}:
                return False  # the banner's closing rule
        if text.startswith("=") and BANNER_START in text:
            self._inside = True
            return False
        return True
