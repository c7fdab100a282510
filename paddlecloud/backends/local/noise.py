"""What a local job's console leaves out of its children's output (their logs keep all of it).

PaddlePaddle's `paddle.distributed.init_parallel_env()` writes a "Modified FLAGS
detected" banner to stderr on every trainer start, whatever the environment says (so
the trainer launcher's quiet defaults cannot turn it off): three lines or more per
trainer and restart, about flags Paddle set itself. And when a collective trainer dies,
the others abort on gloo's IoException with C++'s two-line `terminate called ...` report:
the supervisor says it in one line instead (the group restarts). The console drops both;
the trainer's log file under OUTPUT/logs keeps every line.
"""

from __future__ import annotations

BANNER_START = "Modified FLAGS detected"
GLOO_ABORT = "terminate called after throwing an instance of 'gloo::"


class PaddleNoise:
    """Follows one child's lines: `keep(line)` is False for the lines of Paddle's banner and
    of a gloo abort's C++ report."""

    def __init__(self) -> None:
        self._inside = False
        self._after_abort = False

    def keep(self, line: str) -> bool:
        text = line.strip()
        if self._after_abort:
            self._after_abort = False
            if text.startswith("what():"):
                return False
        if text.startswith(GLOO_ABORT):
            self._after_abort = True
            return False
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
