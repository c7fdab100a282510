"""Parsing of the durations, byte sizes and KEY=VALUE settings that flags and specs take.

Durations: `10s`, `500ms`, `30m`, `2h`, `1m30s`; a bare number is seconds.
Sizes: `64MiB`, `1GiB`, `512KB`, `4096`; a bare number is bytes.
Settings: `KEY=VALUE`, split at the first `=` (the value may hold more).
Every error is a ValueError that names the bad value and says what would be right; what
a KEY may be (an environment variable's name, a reserved one) is the caller's to check.
"""

from __future__ import annotations

import math
import re

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")


def parse_duration(text: str | float | int) -> float:
    """Returns seconds; raises ValueError naming `text` when it is not a duration >= 0."""
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        spec = text.strip().lower()
        try:
            seconds = float(spec)
        except ValueError:
            parts = _DURATION_PART.findall(spec)
            if not parts or "".join(n + u for n, u in parts) != spec:
                raise ValueError(
                    f"invalid duration {text!r}: use e.g. '10s', '500ms', '30m', '1h' "
                    "or a number of seconds"
                ) from None
            seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    if seconds < 0:
        raise ValueError(f"invalid duration {text!r}: must not be negative")
    if not math.isfinite(seconds):  # float() takes 'nan' and 'inf'
        raise ValueError(f"invalid duration {text!r}: must be a finite number of seconds")
    return seconds


def parse_size(text: str | int) -> int:
    """Returns bytes; raises ValueError naming `text` when it is not a size >= 0."""
    if isinstance(text, int):
        size = text
    else:
        match = _SIZE.fullmatch(text.strip().lower())
        if not match or match.group(2) not in _SIZE_UNITS:
            raise ValueError(
                f"invalid size {text!r}: use e.g. '64MiB', '1GiB', '512KB' or a number of bytes"
            )
        size = int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])
    if size < 0:
        raise ValueError(f"invalid size {text!r}: must not be negative")
    return size


def parse_key_value(text: str) -> tuple[str, str]:
    """`"B=x=y"` -> `("B", "x=y")`; raises ValueError naming `text` when there is no `=` or no key."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"{text!r} is not KEY=VALUE, e.g. 'LOG_LEVEL=debug'")
    return key, value
