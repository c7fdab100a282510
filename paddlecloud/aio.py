"""asyncio helpers: stopping tasks for good, and one lock per key.

`task.cancel()` asks once, and a task may not hear it: on Python 3.11 `asyncio.wait_for`
swallows the request when the call it waits on completes at the same moment (CPython
gh-86296, fixed in 3.12; aetcd creates every watch through `wait_for`). Such a task runs
on, and a stop that awaits it waits forever (a watch cancelled while it is being created
is such a task).
`cancel_and_wait` asks again until each task has ended.

`KeyedLocks` serializes what must not interleave for one key (the registrations of one
trainer id) and nothing else: a global lock there would make a storm of registrations
one etcd round trip after another.

`run` runs the master on uvloop's event loop: grpc.aio's machinery and asyncio's own are
most of the master's CPU per call, and uvloop's loop spends less of it than asyncio's
(docs/benchmarks.md, "Dispatch").
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Coroutine, Hashable
from typing import Any, TypeVar

T = TypeVar("T")

ASK_AGAIN_AFTER = 0.5  # seconds between two requests to a task that did not end


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on uvloop's loop; on asyncio's own where uvloop has none (Windows)."""
    if sys.platform == "win32":
        return asyncio.run(main)
    import uvloop  # a dependency everywhere but Windows (pyproject.toml)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


async def cancel_and_wait(*tasks: asyncio.Future | None) -> None:
    """Cancels the tasks (None and finished ones are skipped) and waits until all ended.

    What the tasks raise is taken (not logged as "never retrieved") and dropped: a stop
    only needs them gone. The caller's own cancellation is not swallowed.
    """
    given = [task for task in tasks if task is not None]
    pending = {task for task in given if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=ASK_AGAIN_AFTER)
    for task in given:
        if not task.cancelled():
            task.exception()


class KeyedLocks:
    """One asyncio.Lock per key, made on first use and dropped when no one holds or awaits it."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        """Keys with a holder or a waiter."""
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (None, 0))
        lock = lock or asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            _, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
