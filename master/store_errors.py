"""The master's store faults: what an etcd call that did not go through means for the cache.

Three outcomes, each with its own remedy (docs/design.md section 6): the fence failed
(`NotLeader`: this master steps down), a write's outcome is unknown (`StoreUnavailable`:
the cache is rebuilt from etcd), or a read or lease call went unanswered
(`StoreUnanswered`: nothing was written, the cache stands). They live apart from the
modules that raise them so that every room can catch them without importing etcd's
plumbing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import aetcd
import grpc

from paddlecloud.etcd import EtcdUnavailable


class NotLeader(Exception):
    """The fence failed: another master leads (or none does). `leader` is its address if known."""

    def __init__(self, leader: str | None) -> None:
        super().__init__(f"not the leader; the leader is {leader or 'unknown'}")
        self.leader = leader


class StoreUnavailable(Exception):
    """etcd did not answer: a write's outcome is unknown (the cache must be rebuilt), or a
    read has no answer; the caller retries."""


class StoreUnanswered(StoreUnavailable):
    """etcd did not answer a read or a lease call: nothing of the job's was written, so the
    cache still agrees with etcd (no rebuild); the caller retries."""


class StoreFull(StoreUnavailable):
    """etcd is out of space (its NOSPACE alarm): no write succeeds until an operator acts."""

    def __init__(self, error: BaseException) -> None:
        super().__init__("etcd is out of space (NOSPACE alarm: its --quota-backend-bytes is reached); "
                         "nothing can be written until an operator compacts and defragments it and "
                         "runs `etcdctl alarm disarm`")
        self.__cause__ = error


def is_nospace(error: BaseException) -> bool:
    """etcd's quota error: RESOURCE_EXHAUSTED 'mvcc: database space exceeded', raw or wrapped by aetcd."""
    for e in (error, error.__cause__, error.__context__):
        if isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return True
        if e is not None and "database space exceeded" in str(e):
            return True
    return False


def is_lease_gone(error: BaseException) -> bool:
    """etcd refused a write because a lease it puts a key on does not exist (any more)."""
    return (isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.NOT_FOUND
            and "lease not found" in (error.details() or ""))


@contextlib.contextmanager
def etcd_answers(what: str) -> Iterator[None]:
    """Turns etcd not answering a read or a lease call into StoreUnanswered."""
    try:
        yield
    except (grpc.RpcError, aetcd.ClientError, EtcdUnavailable, asyncio.TimeoutError, OSError) as error:
        if is_nospace(error):
            raise StoreFull(error) from error
        raise StoreUnanswered(f"etcd did not answer {what}: {error}") from error
