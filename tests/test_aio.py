"""Stopping tasks for good (paddlecloud.aio.cancel_and_wait); the master's event loop (aio.run)."""

from __future__ import annotations

import asyncio

import pytest

from paddlecloud.aio import cancel_and_wait

pytestmark = pytest.mark.unit


async def _deaf_once(heard: list[str]) -> None:
    """Swallows the first cancellation, as 3.11's wait_for can, then runs on until asked again."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        heard.append("swallowed")
    await asyncio.Event().wait()


def test_a_task_that_swallowed_one_cancellation_is_asked_again_and_ends():
    async def main() -> list[str]:
        heard: list[str] = []
        task = asyncio.create_task(_deaf_once(heard))
        await asyncio.sleep(0)  # let it start waiting
        await asyncio.wait_for(cancel_and_wait(task), timeout=30)
        assert task.cancelled()
        return heard

    assert asyncio.run(main()) == ["swallowed"]


def test_finished_failed_and_missing_tasks_are_taken_without_raising():
    async def fails() -> None:
        raise RuntimeError("boom")

    async def main() -> tuple[bool, bool]:
        failed = asyncio.create_task(fails())
        finished = asyncio.create_task(asyncio.sleep(0))
        await asyncio.sleep(0.01)
        await cancel_and_wait(failed, finished, None)
        return failed.done(), finished.done()

    assert asyncio.run(main()) == (True, True)


def test_the_callers_own_cancellation_is_not_swallowed():
    async def main() -> None:
        heard: list[str] = []
        stubborn = asyncio.create_task(_deaf_once(heard))
        await asyncio.sleep(0)
        stopper = asyncio.create_task(cancel_and_wait(stubborn))
        await asyncio.sleep(0.01)
        stopper.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopper
        stubborn.cancel()

    asyncio.run(main())


def test_keyed_locks_serialize_one_key_and_let_others_run_then_forget_it():
    from paddlecloud.aio import KeyedLocks

    async def main() -> tuple[list[str], int]:
        locks = KeyedLocks()
        order: list[str] = []
        first_in = asyncio.Event()
        release = asyncio.Event()

        async def holder(key: str, name: str, *, block: bool) -> None:
            async with locks.hold(key):
                order.append(f"{name} in")
                if block:
                    first_in.set()
                    await release.wait()
                order.append(f"{name} out")

        a1 = asyncio.create_task(holder("a", "a1", block=True))
        await first_in.wait()
        a2 = asyncio.create_task(holder("a", "a2", block=False))
        await asyncio.create_task(holder("b", "b1", block=False))  # another key: not held up
        assert order == ["a1 in", "b1 in", "b1 out"] and len(locks) == 1
        release.set()
        await asyncio.gather(a1, a2)
        return order, len(locks)

    order, left = asyncio.run(main())
    assert order == ["a1 in", "b1 in", "b1 out", "a1 out", "a2 in", "a2 out"]
    assert left == 0


def test_run_runs_the_coroutine_on_uvloop_and_returns_its_value():
    from paddlecloud.aio import run

    async def main() -> tuple[str, int]:
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop()).__module__, 42

    module, value = run(main())
    assert module.startswith("uvloop") and value == 42
