"""Registrations per token, bounded: a token bucket per caller's token (`--register-rate`
per second, bursts of `--register-burst`).

One holder of the job's trainer token could otherwise open sessions as fast as the master
takes them, each a lease and a key in etcd, and fill a small etcd quota in seconds. A
legitimate start registers every trainer at once (10,000 in
bench/scale.py), so the burst is sized for the largest job and the rate only refills it:
a job starts in one burst and a restarted group finds the bucket full again soon after.

A registration past the bucket is answered RESOURCE_EXHAUSTED with a `google.rpc.RetryInfo`
(when a token will be there, at least MIN_RETRY) before any etcd work; the trainer client
waits that long, jittered, and registers again (`trainer_agent.client`).

What this does NOT do: bound anything but registrations (a session's calls are bounded by
`--max-calls-in-flight` and the per-call caps), or remember buckets across a failover.
"""

from __future__ import annotations

import time
from collections.abc import Callable

MIN_RETRY = 1.0  # seconds a refused registration is told to wait at least


class RateLimited(Exception):
    """Too many registrations with one token; `retry_after` seconds until one may succeed."""

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TokenBucket:
    """`burst` tokens at most, `rate` more per second; `take()` spends one or says how long until one."""

    def __init__(self, *, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.updated = now

    def take(self, now: float) -> float:
        """0 when a token was spent; else the seconds until one is there (none spent)."""
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class RegistrationLimit:
    """A bucket per token (by its role: a job has one trainer token and one operator token)."""

    def __init__(self, *, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"--register-rate {rate:g} and --register-burst {burst} must be positive")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def admit(self, token: str) -> None:
        """Spends one registration of `token`; raises RateLimited when it has none left."""
        now = self._clock()
        bucket = self._buckets.get(token)
        if bucket is None:
            bucket = self._buckets[token] = TokenBucket(rate=self.rate, burst=self.burst, now=now)
        wait = bucket.take(now)
        if wait:
            raise RateLimited(
                f"too many registrations with the {token} token: more than {self.burst} at once or "
                f"{self.rate:g}/s (--register-burst, --register-rate); retry in about {max(MIN_RETRY, wait):g}s",
                retry_after=max(MIN_RETRY, wait))
