"""The one wait helper of the tests: returns the condition's value, or fails naming it."""

from __future__ import annotations

import itertools

import pytest
from waiting import wait_for, wait_until

pytestmark = pytest.mark.unit


async def test_wait_for_returns_the_first_truthy_value_of_a_sync_or_async_predicate():
    calls = itertools.count()
    assert await wait_for(lambda: next(calls) >= 2 and "ready", interval=0.001) == "ready"

    async def later() -> list[int]:
        return [1] if next(calls) >= 5 else []

    assert await wait_for(later, interval=0.001) == [1]


async def test_wait_for_fails_after_the_timeout_with_the_message_and_details():
    with pytest.raises(AssertionError, match=r"not met after 0.05s: the flag\nlog: nothing"):
        await wait_for(lambda: False, timeout=0.05, interval=0.01, message="the flag",
                       details=lambda: "log: nothing")


def test_wait_until_returns_the_value_or_fails_naming_the_condition():
    calls = itertools.count()
    assert wait_until(lambda: next(calls) == 3 and 42, interval=0.001) == 42
    with pytest.raises(AssertionError, match="not met after 0.05s: never"):
        wait_until(lambda: None, timeout=0.05, interval=0.01, message="never")
