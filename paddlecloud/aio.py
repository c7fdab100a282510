"""Stopping asyncio tasks for good.

`task.cancel()` asks once, and a task may not hear it: on Python 3.11 `asyncio.wait_for`
swallows the request when the call it waits on completes at the same moment (CPython
gh-86296, fixed in 3.12; aetcd creates every watch through `wait_for`). Such a task runs
on, and a stop that awaits it waits forever: a master failing at start-up on a changed
dataset hung that way, its session watch cancelled while the watch was being created.
`cancel_and_wait` asks again until each task has ended.
"""

from __future__ import annotations

import asyncio

ASK_AGAIN_AFTER = 0.5  # seconds between two requests to a task that did not end


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
