"""Waiting in tests: poll a condition until it holds, with a generous deadline, never a
bare sleep that hopes things settled. One helper for every test, async and sync.

`wait_for` (in a coroutine) and `wait_until` (in a plain test) poll `predicate` until it
returns something truthy and return that value; past `timeout` they fail the test with
`message` and, if given, `details()` (a log, a state dump) to show why.

What this does NOT do: interrupt a predicate that blocks — each call must return soon.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


class _Deadline:
    def __init__(self, timeout: float, message: str, details: Callable[[], str] | None) -> None:
        self.timeout, self.message, self.details = timeout, message, details
        self.at = time.monotonic() + timeout

    def check(self) -> None:
        """Fails the test once the deadline passed."""
        if time.monotonic() > self.at:
            extra = f"\n{self.details()}" if self.details else ""
            raise AssertionError(f"condition not met after {self.timeout:g}s: {self.message}{extra}")


async def wait_for(predicate: Callable[[], Any], *, timeout: float = 30.0, interval: float = 0.05,
                   message: str = "", details: Callable[[], str] | None = None) -> Any:
    """Polls a plain or async `predicate` until it returns a truthy value, which it returns."""
    deadline = _Deadline(timeout, message, details)
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        deadline.check()
        await asyncio.sleep(interval)


def wait_until(predicate: Callable[[], Any], *, timeout: float = 60.0, interval: float = 0.05,
               message: str = "", details: Callable[[], str] | None = None) -> Any:
    """The same for synchronous tests: polls `predicate()` until it is truthy, returns its value."""
    deadline = _Deadline(timeout, message, details)
    while not (value := predicate()):
        deadline.check()
        time.sleep(interval)
    return value
