"""Client-supplied strings, made safe to log and to quote in an error message.

Anything a caller sends (a trainer id, a failure reason, a page token, a path) may be
huge or hold newlines, NUL and terminal escape bytes. `quote()` is the one way such a
value enters an error message (a short, escaped prefix and its length, so a reply
never outgrows gRPC's metadata limit); `loggable()` is the one way it enters a log
line (escaped, so a newline cannot forge a line, and capped).

What this does NOT do: validate anything; it only makes a value harmless to print.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

QUOTE_LIMIT = 64     # characters of a bad value an error message shows
LOG_LIMIT = 256      # characters of a client string a log line shows


def _escaped(value: str | bytes, limit: int) -> tuple[str, int]:
    text = value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)
    # unicode_escape turns newlines, NUL, ESC and every other control byte into \n, \x00, \x1b
    head = text[:limit].encode("unicode_escape").decode("ascii")
    return head, len(text)


def quote(value: str | bytes, *, limit: int = QUOTE_LIMIT) -> str:
    """`'abc'`, or `'abc...' (1048576 chars)` for a value longer than `limit`: escaped, short."""
    head, length = _escaped(value, limit)
    if length <= limit:
        return f"'{head}'"
    return f"'{head}...' ({length} chars)"


def loggable(value: str | bytes, *, limit: int = LOG_LIMIT) -> str:
    """The value escaped for one log line, cut at `limit` characters (marked when cut)."""
    head, length = _escaped(value, limit)
    return head if length <= limit else f"{head}...({length} chars)"
