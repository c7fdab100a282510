"""A job's goodput in one line, as `paddlecloud job status` and `local train` print it.

The figures are the master's `GetStatus.trainer_seconds` (master.goodput defines each cause);
this only words them: the productive share, then the lost trainer-seconds by cause, most
first.
"""

from __future__ import annotations

from collections.abc import Mapping


def summarize_trainer_seconds(figures: Mapping[str, float]) -> str:
    """One line of a job's goodput (docs/design.md section 12); "" before any second counted."""
    total = sum(figures.values())
    if total < 1:
        return ""
    productive = figures.get("productive", 0.0)
    lost = sorted(((v, c) for c, v in figures.items() if c != "productive" and v >= 0.5), reverse=True)
    line = (f"goodput: {100 * productive / total:.0f}% productive ({productive:,.0f} of "
            f"{total:,.0f} trainer-seconds)")
    if lost:
        line += "; lost: " + ", ".join(f"{cause} {value:,.0f}s" for value, cause in lost)
    return line
