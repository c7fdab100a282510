"""The one rule for a real part a test needs (a browser, a container engine, a PS-capable
Paddle): where it is missing the test skips, saying why and how to get it; under CI
(`CI=true`), whose `.ci/run` installs every part, it fails instead."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest


def require(why_missing: str, *, needs: str) -> None:
    """Skips (or under CI fails) the calling test when `why_missing` is not empty."""
    if not why_missing:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true needs {needs}: {why_missing}")
    pytest.skip(why_missing)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Holds an exclusive lock on `path`: two pytest workers never build one part twice."""
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
