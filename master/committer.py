"""The fenced group committer: the one way the leading master writes the job's state.

Every write is one nested transaction (`Txn`) with its own compares and ops. Many RPCs'
writes ride in one etcd request, each nested, so one failed compare never fails the
others (nor does a write on a lease that lapsed: the batch is sent again without it),
and every caller is answered only after the request is durable. The request as a whole
compares the leader key's creation revision (the election fence), so a deposed master
that still runs changes nothing (invariant 4 of docs/design.md section 6). Keys written
by one nested transaction never overlap another's in the same request (etcd refuses
that), and a write that covers whole prefixes rides alone.

What this does NOT do: know what a write means (`master.transactions` builds them from
the machine's events), or read anything but the leader key when the fence fails.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import aetcd
from aetcd import rpc

from master import metrics
from master.store_errors import NotLeader, StoreFull, StoreUnavailable, is_lease_gone, is_nospace
from paddlecloud.aio import cancel_and_wait
from paddlecloud.etcd import Leadership
from paddlecloud.keys import prefix_range_end

logger = logging.getLogger(__name__)

MAX_TXN_OPS = 128  # etcd's default --max-txn-ops


# ---- building blocks ----------------------------------------------------------------


def put(key: bytes, value: bytes | str, lease: int = 0) -> rpc.RequestOp:
    value = value.encode() if isinstance(value, str) else value
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))


def delete(key: bytes, range_end: bytes = b"") -> rpc.RequestOp:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key, range_end=range_end))


def delete_prefix(prefix: bytes) -> rpc.RequestOp:
    return delete(prefix, prefix_range_end(prefix))


def value_is(key: bytes, value: bytes | str) -> rpc.Compare:
    value = value.encode() if isinstance(value, str) else value
    return rpc.Compare(key=key, target=rpc.Compare.VALUE, result=rpc.Compare.EQUAL, value=value)


def version_is(key: bytes, version: int, range_end: bytes = b"") -> rpc.Compare:
    return rpc.Compare(key=key, range_end=range_end, target=rpc.Compare.VERSION,
                       result=rpc.Compare.EQUAL, version=version)


def mod_revision_is(key: bytes, revision: int) -> rpc.Compare:
    return rpc.Compare(key=key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL,
                       mod_revision=revision)




def nested_txn(compares: list[rpc.Compare], ops: list[rpc.RequestOp]) -> rpc.RequestOp:
    """One write as a nested transaction: its own compares, its own ops."""
    return rpc.RequestOp(request_txn=rpc.TxnRequest(compare=compares, success=ops))


@dataclass(slots=True)
class Txn:
    """One write, ready to ride in a group-commit batch (not frozen: made for each write, see
    `master.tasks.TaskRef`)."""

    op: rpc.RequestOp          # the nested transaction (the hot paths build it in place)
    width: int                 # max(compares, ops): what etcd counts against --max-txn-ops
    keys: frozenset[bytes] = frozenset()   # keys it writes: two writes of a key never share a batch
    exclusive: bool = False    # rides alone (it writes whole prefixes)

    @classmethod
    def of(cls, compares: list[rpc.Compare], ops: list[rpc.RequestOp],
           keys: Iterable[bytes] = (), *, exclusive: bool = False) -> Txn:
        return cls(nested_txn(compares, ops), max(len(compares), len(ops)), frozenset(keys), exclusive)


# Told etcd's answer to one write: (revision, None) when it held (revision None: a compare
# failed), (None, error) when it failed. It may raise: the write's awaiter hears that instead.
Answered = Callable[[int | None, BaseException | None], None]


@dataclass(slots=True)
class _Write:
    txn: Txn
    future: asyncio.Future[int | None] = field(repr=False)
    then: Answered | None = field(default=None, repr=False)

    def answer(self, revision: int | None, error: BaseException | None = None) -> None:
        """Tells `then` first, whether or not anyone still awaits the future: a caller
        cancelled while its write was on the wire cancels its wait, not etcd's answer."""
        if self.then is not None:
            try:
                self.then(revision, error)
            except Exception as raised:  # noqa: BLE001  (the awaiter hears it)
                error = raised
        if self.future.done():
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(revision)


def _fail_all(writes: Iterable[_Write], error: Exception) -> None:
    for write in writes:
        write.answer(None, error)


class GroupCommitter:
    """Queues transactions and sends them to etcd in batches, one batch in flight.

    `commit()` returns the revision of the request when the transaction's compares
    held (its writes are then durable), None when they did not; it raises NotLeader
    when the fence failed and StoreUnavailable when etcd did not answer.
    """

    def __init__(self, client: aetcd.Client, leadership: Leadership, *, timeout: float = 10.0) -> None:
        self._client = client
        self._leadership = leadership
        self._timeout = timeout
        self._queue: deque[_Write] = deque()
        self._sending: list[_Write] = []
        self._stopped = False
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._fence = leadership.fence()
        self._on_fence_failed = rpc.RequestOp(request_range=rpc.RangeRequest(key=leadership.key))
        self.batches = 0
        self.writes = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="group-commit")

    async def stop(self) -> None:
        """Stops sending; every write not answered yet fails (its outcome is unknown)."""
        self._stopped = True
        await cancel_and_wait(self._task)
        _fail_all([*self._sending, *self._queue], NotLeader(None))
        self._queue.clear()
        self._sending = []

    def submit(self, compares: list[rpc.Compare], ops: list[rpc.RequestOp],
               keys: frozenset[bytes] = frozenset(), *, exclusive: bool = False,
               ) -> asyncio.Future[int | None]:
        """Queues one transaction; the future resolves as `commit()` returns."""
        return self.submit_txn(Txn.of(compares, ops, keys, exclusive=exclusive))

    def submit_txn(self, txn: Txn, then: Answered | None = None) -> asyncio.Future[int | None]:
        """`submit()` of a transaction already built; `then` is told etcd's answer as it
        comes, before the future resolves, even when the future was cancelled meanwhile."""
        write = _Write(txn, asyncio.get_running_loop().create_future(), then)
        if self._stopped:
            write.answer(None, NotLeader(None))
            return write.future
        self._queue.append(write)
        self._wakeup.set()
        return write.future

    async def commit(self, compares: list[rpc.Compare], ops: list[rpc.RequestOp],
                     keys: frozenset[bytes] = frozenset(), *, exclusive: bool = False) -> int | None:
        return await self.submit(compares, ops, keys, exclusive=exclusive)

    def _next_batch(self) -> list[_Write]:
        """The writes at the head of the queue that can share one request.

        etcd checks a nested transaction against what the outer one leaves of
        --max-txn-ops (`checkTxnRequest(r, maxTxnOps - len(outer))`), so a batch of B
        writes whose widest has W compares or ops needs B + W <= MAX_TXN_OPS.
        """
        batch: list[_Write] = []
        touched: set[bytes] = set()
        widest = 0
        while self._queue:
            txn = self._queue[0].txn
            if txn.exclusive and batch:
                break
            if touched & txn.keys:
                break  # keep per-key order: the rest waits for the next batch
            width = max(widest, txn.width)
            if batch and len(batch) + 1 + width > MAX_TXN_OPS:
                break
            widest = width
            batch.append(self._queue.popleft())
            touched |= txn.keys
            if txn.exclusive:
                break
        return batch

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue:
                self._sending = self._next_batch()
                await self._send(self._sending)
                self._sending = []

    async def _send(self, batch: list[_Write]) -> None:
        request = rpc.TxnRequest(compare=[self._fence], success=[w.txn.op for w in batch],
                                 failure=[self._on_fence_failed])
        try:
            reply = await self._client.kvstub.Txn(request, timeout=self._timeout,
                                                  metadata=self._client.metadata)
        except Exception as error:  # grpc errors, timeouts: the outcome is unknown
            if is_lease_gone(error):
                await self._without_lapsed_lease(batch)
                return
            _fail_all(batch, StoreFull(error) if is_nospace(error)
                      else StoreUnavailable(f"etcd transaction failed: {error}"))
            return
        self.batches += 1
        self.writes += len(batch)
        metrics.BATCH_SIZE.observe(len(batch))
        if not reply.succeeded:
            kvs = reply.responses[0].response_range.kvs if reply.responses else []
            _fail_all(batch, NotLeader(kvs[0].value.decode() if kvs else None))
            return
        revision = reply.header.revision
        for write, result in zip(batch, reply.responses, strict=True):
            write.answer(revision if result.response_txn.succeeded else None)

    async def _without_lapsed_lease(self, batch: list[_Write]) -> None:
        """etcd refused the whole request because a write puts a key on a lease that is gone
        (its session lapsed before the write went out; no compare can test a lease), and
        applied none of it. That is no store fault: failing every write of the batch would
        rebuild the cache for each such batch, which a master slower than its session TTL
        meets often. The batch is sent again in halves until that write rides alone, and it
        alone is refused (None), as a failed compare would be."""
        if len(batch) == 1:
            logger.info("a write's lease had lapsed before it reached etcd: refused")
            batch[0].answer(None)
            return
        half = len(batch) // 2
        await self._send(batch[:half])
        await self._send(batch[half:])
