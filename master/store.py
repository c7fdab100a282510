"""The master's etcd store: each durable state event is one small transaction.

`txn_for(event, state)` is the one place a `master.state` event becomes its etcd
transaction; the dispatcher commits an event by submitting that transaction and
applying the event once etcd took it. Every write compares the leader key's
creation revision (the election fence), so a deposed master that still runs
changes nothing (invariant 4). Writes are group-committed: many RPCs' transactions
ride as nested transactions in one etcd request, each with its own compares, so one
failed compare never fails the others (nor does a write on a lease that lapsed: the batch
is sent again without it), and every caller is answered only after the request is durable.
Keys written by one nested transaction never overlap another's in the same request (etcd
refuses that).

The store is also the master's only reader of etcd (the snapshot a cache is rebuilt
from, the pservers, the save-model grant, the leader key, the watch of trainer keys)
and the owner of the trainer leases' grant, refresh and revocation.

What this does NOT do: decide anything. The dispatcher decides from its cache of
`JobState`; this module only makes etcd agree, or says it did not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol, assert_never

import aetcd
import grpc
from aetcd import rpc

from master import metrics
from master.config import DatasetSpec
from master.partition import FileEntry
from master.state import (
    Assignment,
    Durable,
    EpochAdvanced,
    EpochRestarted,
    JobFailed,
    JobState,
    TaskAssigned,
    TaskFailed,
    TaskFinished,
    TaskReleased,
    TaskSplit,
)
from paddlecloud.aio import cancel_and_wait
from paddlecloud.elastic import TrainerRange
from paddlecloud.etcd import EtcdUnavailable, Leadership, LeaseKeeper, read_key_numbers, read_range
from paddlecloud.keys import JobKeys, prefix_range_end
from paddlecloud.phase import Phase

logger = logging.getLogger(__name__)

MAX_TXN_OPS = 128  # etcd's default --max-txn-ops
MAX_RESTART_DONE = (MAX_TXN_OPS - 6) // 2  # done marks a RestartEpoch keeps in its own txn
RESTART_MARKS_PER_TXN = MAX_TXN_OPS - 8   # done marks per follow-up write of a bigger restart
MAX_RESTART_LIST = 100_000  # done tasks a restart lists in its marker (about 0.6 MB of value)
DONE_RANGE = 10_000  # done marks per range the load reads them in (about)
MAX_FILES_PIECE = 512 * 1024  # bytes of file list per `files/<n>` value (etcd values stay < 1 MiB)


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
def _etcd_answers(what: str) -> Iterator[None]:
    """Turns etcd not answering a read or a lease call into StoreUnanswered."""
    try:
        yield
    except (grpc.RpcError, aetcd.ClientError, EtcdUnavailable, asyncio.TimeoutError, OSError) as error:
        if is_nospace(error):
            raise StoreFull(error) from error
        raise StoreUnanswered(f"etcd did not answer {what}: {error}") from error


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


_VALUE, _VERSION, _MOD, _EQUAL = (rpc.Compare.VALUE, rpc.Compare.VERSION, rpc.Compare.MOD,
                                  rpc.Compare.EQUAL)


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


# ---- reading ------------------------------------------------------------------------


@dataclass
class Snapshot:
    """What etcd holds of one job, read at one revision."""

    revision: int
    spec: DatasetSpec | None = None
    files: list[FileEntry] = field(default_factory=list)
    epoch: int | None = None
    phase: Phase | None = None
    trainers: dict[str, int] = field(default_factory=dict)        # trainer id -> session
    superseded: dict[int, str] = field(default_factory=dict)      # old session -> trainer id
    assignments: dict[int, Assignment] = field(default_factory=dict)
    done: list[int] = field(default_factory=list)
    mirrored: bool = False      # `done` came from a standby's mirror, not read at `revision`
    failures: dict[int, int] = field(default_factory=dict)
    pservers: dict[int, str] = field(default_factory=dict)
    extents: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # the epoch's cut units


def encode_extent(root: int, lo: int, hi: int) -> bytes:
    """The `extents/<epoch>/<unit>` value (work stealing: master.stealing)."""
    return b'{"task":%d,"lo":%d,"hi":%d}' % (root, lo, hi)


def encode_assignment(a: Assignment, epoch: int, trainer_json: bytes | None = None) -> bytes:
    """The `assign/<task>` value: compact JSON, as json.dumps would write it (hot path)."""
    trainer = trainer_json or json.dumps(a.trainer).encode()
    return b'{"session":%d,"trainer":%s,"epoch":%d,"deadline":%s}' % (
        a.session, trainer, epoch, repr(float(a.deadline)).encode())


class MarkMirror(Protocol):
    """A copy of the done marks kept outside the load (`master.mirror.DoneMarkMirror`)."""

    async def marks(self, epoch: int, *, revision: int) -> list[int] | None:
        """`epoch`'s marks with every change up to `revision` applied; None if not known."""


async def count_keys(client: aetcd.Client, key: bytes, range_end: bytes, *, revision: int) -> int:
    """How many keys [key, range_end) holds at `revision` (etcd counts them in its index)."""
    await client.connect()
    counted = await client.kvstub.Range(
        rpc.RangeRequest(key=key, range_end=range_end, revision=revision, count_only=True),
        timeout=30, metadata=client.metadata)
    return counted.count


async def read_done_marks(client: aetcd.Client, keys: JobKeys, epoch: int, revision: int) -> list[int]:
    """The tasks marked done in `epoch` at `revision`: keys only, in ranges of about
    DONE_RANGE marks each (by the leading digits of the task id), a few at once, each
    decoded without an object per key (`read_key_numbers`)."""
    base = keys.kind_prefix("done") + b"%d/" % epoch
    count = await count_keys(client, base, prefix_range_end(base), revision=revision)
    digits = len(str(max(1, count // DONE_RANGE - 1)))
    if count <= DONE_RANGE:
        ranges = [(base, prefix_range_end(base))]
    else:
        # ids shorter than `digits` are single keys; the others share their first `digits` digits
        ranges = [(key, key + b"\0") for width in range(1, digits)
                  for key in (base + b"%0*d" % (width, i) for i in range(10 ** width))]
        ranges += [(key, prefix_range_end(key))
                   for key in (base + b"%0*d" % (digits, i) for i in range(10 ** digits))]
    gate = asyncio.Semaphore(16)

    async def read(lo: bytes, hi: bytes) -> list[int]:
        async with gate:
            return await read_key_numbers(client, base, lo, hi, revision=revision)

    done: list[int] = []
    for part in await asyncio.gather(*(read(lo, hi) for lo, hi in ranges)):
        done.extend(part)
    return done


class EtcdStore:
    """The job's keys in etcd, and the one transaction each durable event takes."""

    def __init__(self, client: aetcd.Client, keys: JobKeys, leadership: Leadership, *,
                 keeper: LeaseKeeper | None = None) -> None:
        self.client = client
        self.keys = keys
        self.leadership = leadership
        self.committer = GroupCommitter(client, leadership)
        # the trainers' leases; the master refreshes them from a process of its own
        # (paddlecloud.lease_process, closed by whoever gave it), else on this loop
        self._own_keeper = keeper is None
        self.keeper = keeper if keeper is not None else LeaseKeeper(client)
        # The hot paths' keys, from prefixes computed once (JobKeys builds them from strings).
        self._assign_prefix = keys.kind_prefix("assign")
        self._done_prefix = keys.kind_prefix("done")
        self._epoch_key = keys.epoch
        # A bigger restart's list of done tasks, until their marks are written (`restart_marks`).
        self.restart_key = keys.kind_prefix("restart") + b"done"
        self._trainers: dict[str, tuple[bytes, bytes]] = {}   # id -> (key, JSON string)
        assert self._assign_key(7) == keys.assign(7) and self._done_key(3, 7) == keys.done(3, 7)

    def _assign_key(self, task: int) -> bytes:
        return self._assign_prefix + b"%d" % task

    def _done_key(self, epoch: int, task: int) -> bytes:
        return self._done_prefix + b"%d/%d" % (epoch, task)

    def _trainer(self, trainer: str) -> tuple[bytes, bytes]:
        found = self._trainers.get(trainer)
        if found is None:
            if len(self._trainers) > 100_000:
                self._trainers.clear()
            found = self._trainers[trainer] = (self.keys.trainer(trainer), json.dumps(trainer).encode())
        return found

    async def start(self) -> None:
        self.committer.start()
        self.keeper.start()  # the lease process starts while the cache loads, not at the first KeepAlive

    async def stop(self) -> None:
        await self.committer.stop()
        if self._own_keeper:
            await self.keeper.close()

    # -- the state's events --

    def submit(self, event: Durable, state: JobState, then: Answered | None = None) -> asyncio.Future[int | None]:
        """Queues `event`'s transaction; resolves to the revision, or None if a compare failed
        (`then`: as `GroupCommitter.submit_txn`)."""
        return self.committer.submit_txn(self.txn_for(event, state), then)

    def txn_for(self, event: Durable, state: JobState) -> Txn:
        """The one etcd transaction that stands for `event`, applied to `state` as it is now."""
        k = self.keys
        match event:
            case TaskAssigned(task=task, assignment=assignment):
                return self._assign_txn(task, state.epoch, assignment)
            case TaskFinished(task=task, attempt=attempt):
                return self._finish_txn(task, state.epoch, attempt)
            case TaskFailed(task=task, attempt=attempt):
                # counts the failure iff `attempt` is live and the count is the cache's
                before, failures = state.failures[task], k.failures(state.epoch, task)
                return Txn.of([mod_revision_is(k.assign(task), attempt), version_is(failures, before)],
                              [put(failures, str(before + 1)), delete(k.assign(task))],
                              (k.assign(task), failures))
            case TaskReleased(task=task, attempt=attempt):
                return Txn.of([mod_revision_is(k.assign(task), attempt)], [delete(k.assign(task))],
                              (k.assign(task),))
            case TaskSplit():
                return self._split_txn(event, state)
            case EpochAdvanced(epoch=epoch):
                # ends the epoch before `epoch` only if no assignment is live; old marks go.
                # The last one (epoch >= num_epochs: the data's end) leaves `phase` alone:
                # Succeeded is the deployer's verdict, once the trainers are done too.
                assign_prefix = k.kind_prefix("assign")
                ops = [put(k.epoch, str(epoch)), delete_prefix(k.kind_prefix("done")),
                       delete_prefix(k.kind_prefix("failures")), delete(self.restart_key),
                       delete_prefix(k.kind_prefix("extents"))]
                return Txn.of([value_is(k.epoch, str(epoch - 1)),
                               version_is(assign_prefix, 0, prefix_range_end(assign_prefix))],
                              ops, exclusive=True)
            case JobFailed(epoch=epoch):
                return Txn.of([value_is(k.epoch, str(epoch))], [put(k.phase, Phase.FAILED.value)],
                              exclusive=True)
            case EpochRestarted(epoch=epoch, done=done):
                # sessions stay; their assignments and the save-model grant (the old group's:
                # its holder may be stopped and never leave) are gone; the checkpoint's tasks are done:
                # their marks kept or written here, or (more than one transaction holds)
                # every mark deleted and the list put in the restart marker, whose marks
                # `restart_marks` then writes in follow-up transactions
                if len(done) <= MAX_RESTART_DONE:
                    marks = [*self._restart_done_ops(epoch, done), delete(self.restart_key)]
                else:
                    marks = [delete_prefix(self._done_prefix),
                             put(self.restart_key, json.dumps({"epoch": epoch, "done": list(done)},
                                                              separators=(",", ":")))]
                # the epoch in progress keeps its cuts (JobState._restart), others' go
                cuts = [] if state.restart_units(epoch) > state.num_tasks else [
                    delete_prefix(k.kind_prefix("extents"))]
                return Txn.of([], [put(k.epoch, str(epoch)), put(k.phase, Phase.RUNNING.value),
                                   *marks,
                                   delete_prefix(k.kind_prefix("failures")), *cuts,
                                   delete_prefix(k.kind_prefix("assign")), delete(k.save_model)],
                              exclusive=True)
            case _:
                assert_never(event)

    def _split_txn(self, e: TaskSplit, state: JobState) -> Txn:
        """Cuts live assignment `attempt` of `task` short at `at` and makes the rest piece
        `piece`, iff the assignment is still that one (its holder agreed to stop there) and the
        epoch has not moved. The assignment's key is not written: its revision, the holder's
        fencing token, stays, so the holder's finish counts its own part done."""
        k, epoch = self.keys, state.epoch
        cut, piece = k.extent(epoch, e.task), k.extent(epoch, e.piece)
        before = state.extent(e.task)
        return Txn.of([mod_revision_is(k.assign(e.task), e.attempt), value_is(k.epoch, str(epoch)),
                       version_is(piece, 0),
                       value_is(cut, encode_extent(*before)) if before else version_is(cut, 0)],
                      [put(cut, encode_extent(e.root, e.lo, e.at)),
                       put(piece, encode_extent(e.root, e.at, e.end))],
                      (cut, piece))

    def _restart_done_ops(self, epoch: int, done: tuple[int, ...]) -> list[rpc.RequestOp]:
        """Every done mark deleted but those of `done`, which are kept or written.

        etcd refuses a key both deleted and written in one request, so the deletes are
        the ranges between `done`'s keys, and each of those is put only when absent
        (a nested transaction): a mark that stays is not written twice."""
        prefix = self._done_prefix
        keys = sorted(self._done_key(epoch, t) for t in done)
        ops: list[rpc.RequestOp] = []
        start = prefix
        for key in keys:
            if start < key:
                ops.append(delete(start, key))
            ops.append(nested_txn([version_is(key, 0)], [put(key, b"")]))
            start = key + b"\0"
        ops.append(delete(start, prefix_range_end(prefix)))
        return ops

    async def restart_marks(self, epoch: int, done: tuple[int, ...], *, revision: int) -> bool:
        """Writes the done marks of a bigger restart committed at `revision`, then deletes its
        marker; False when the marker is no longer that restart's (nothing more written).

        Each write compares the marker's revision, so none lands after a later restart or
        the epoch's end. Until the marker is gone, `load` takes its list as the epoch's
        done tasks: a master that dies half-way leaves the restarted epoch, consistent.
        A mark is put only when absent, so a write repeated after a failure counts nothing twice.
        """
        fence = mod_revision_is(self.restart_key, revision)
        keys = [self._done_key(epoch, t) for t in done]
        for start in range(0, len(keys), RESTART_MARKS_PER_TXN):
            chunk = keys[start:start + RESTART_MARKS_PER_TXN]
            if await self.commit([fence], [nested_txn([version_is(key, 0)], [put(key, b"")])
                                           for key in chunk], frozenset(chunk)) is None:
                return False
        return await self.commit([fence], [delete(self.restart_key)],
                                 frozenset([self.restart_key])) is not None

    def _assign_txn(self, task: int, epoch: int, assignment: Assignment) -> Txn:
        """Compares: the trainer's key still names this session, the task has no assignment
        and no done mark this epoch, the epoch has not moved. Built in place (hot path);
        the write's revision is the attempt."""
        trainer_key, trainer_json = self._trainer(assignment.trainer)
        assign_key = self._assign_key(task)
        op = rpc.RequestOp()
        txn = op.request_txn
        add = txn.compare.add
        add(key=trainer_key, target=_VALUE, result=_EQUAL, value=b"%d" % assignment.session)
        add(key=assign_key, target=_VERSION, result=_EQUAL, version=0)
        add(key=self._done_key(epoch, task), target=_VERSION, result=_EQUAL, version=0)
        add(key=self._epoch_key, target=_VALUE, result=_EQUAL, value=b"%d" % epoch)
        request = txn.success.add().request_put
        request.key = assign_key
        request.value = encode_assignment(assignment, epoch, trainer_json)
        request.lease = assignment.session
        return Txn(op, 4, frozenset((assign_key,)))

    def _finish_txn(self, task: int, epoch: int, attempt: int) -> Txn:
        """Counts the task done for `epoch` iff `attempt` is its live assignment (invariant 2).

        Compares: the assignment is the one of `attempt`, no done mark yet; puts the mark,
        deletes the assignment. Built in place (hot path).
        """
        assign_key, done_key = self._assign_key(task), self._done_key(epoch, task)
        op = rpc.RequestOp()
        txn = op.request_txn
        add = txn.compare.add
        add(key=assign_key, target=_MOD, result=_EQUAL, mod_revision=attempt)
        add(key=done_key, target=_VERSION, result=_EQUAL, version=0)
        txn.success.add().request_put.key = done_key
        txn.success.add().request_delete_range.key = assign_key
        return Txn(op, 2, frozenset((assign_key, done_key)))

    # -- other writes: not task-state events --

    async def commit(self, compares: list[rpc.Compare], ops: list[rpc.RequestOp],
                     keys: frozenset[bytes] = frozenset(), *, exclusive: bool = False) -> int | None:
        return await self.committer.commit(compares, ops, keys, exclusive=exclusive)

    async def freeze_dataset(self, spec: DatasetSpec, files: list[FileEntry], *, epoch: int) -> bool:
        """Writes the file list, then the spec and epoch; False if a spec was there already."""
        encoded = [[f.path, f.size] for f in files]
        pieces: list[list] = [[]]
        size = 0
        for item in encoded:
            item_size = len(json.dumps(item)) + 1
            if size + item_size > MAX_FILES_PIECE and pieces[-1]:
                pieces.append([])
                size = 0
            pieces[-1].append(item)
            size += item_size
        await self.commit([], [delete_prefix(self.keys.kind_prefix("files"))], exclusive=True)
        for n, piece in enumerate(pieces):
            await self.commit([version_is(self.keys.spec, 0)],
                              [put(self.keys.files(n), json.dumps(piece, separators=(",", ":")))],
                              exclusive=True)
        revision = await self.commit(
            [version_is(self.keys.spec, 0)],
            [put(self.keys.spec, spec.to_json()), put(self.keys.epoch, str(epoch))],
            exclusive=True,
        )
        return revision is not None

    async def set_phase(self, phase: Phase) -> None:
        await self.commit([], [put(self.keys.phase, phase.value)], frozenset([self.keys.phase]))

    async def set_goodput(self, figures: str) -> None:
        await self.commit([], [put(self.keys.goodput, figures)], frozenset([self.keys.goodput]))

    async def goodput(self) -> bytes | None:
        """The goodput figures the job's last leader wrote (master.goodput), None before any."""
        with _etcd_answers("the goodput figures"):
            found = await self.client.get(self.keys.goodput)
        return found.value if found is not None else None

    # -- the trainer range (DESIGN.md section 11) --

    async def init_trainer_size(self, span: TrainerRange, desired: int) -> bool:
        """Writes the range and the desired size once; False if the job has a range already."""
        k = self.keys
        return await self.commit([version_is(k.trainers_range, 0)],
                                 [put(k.trainers_range, span.to_json()),
                                  put(k.trainers_desired, str(desired))],
                                 frozenset([k.trainers_range, k.trainers_desired])) is not None

    async def set_trainers_desired(self, desired: int, *, span: TrainerRange) -> bool:
        """The desired size, while the range is still `span`; False if it changed meanwhile."""
        k = self.keys
        return await self.commit([value_is(k.trainers_range, span.to_json())],
                                 [put(k.trainers_desired, str(desired))],
                                 frozenset([k.trainers_desired])) is not None

    async def trainer_size(self) -> tuple[TrainerRange, int] | None:
        """(range, desired) as etcd holds them, None before they were written."""
        k = self.keys
        with _etcd_answers("the trainer range"):
            span = await self.client.get(k.trainers_range)
            desired = await self.client.get(k.trainers_desired)
        if span is None or desired is None:
            return None
        return TrainerRange.from_json(span.value), int(desired.value)

    async def open_session(self, trainer: str, session: int, *, superseded: int | None) -> bool:
        """Binds `trainer` to the new session; the superseded one is remembered on the new lease."""
        k = self.keys
        ops = [put(k.trainer(trainer), str(session), lease=session)]
        if superseded:
            ops.append(put(k.superseded(superseded), trainer, lease=session))
        return await self.commit([], ops, frozenset([k.trainer(trainer)])) is not None

    async def grant_save_model(self, trainer: str, lease: int) -> bool:
        k = self.keys
        return await self.commit([version_is(k.save_model, 0)],
                                 [put(k.save_model, trainer, lease=lease)],
                                 frozenset([k.save_model])) is not None

    async def release_save_model(self, trainer: str) -> None:
        """Deletes the save-model grant if `trainer` holds it (its session ended)."""
        k = self.keys
        await self.commit([value_is(k.save_model, trainer)], [delete(k.save_model)], frozenset([k.save_model]))

    # -- leases --

    async def grant_lease(self, ttl: float) -> int:
        """A new lease of `ttl` seconds (at least 1); its id."""
        with _etcd_answers("a lease grant"):
            return (await self.client.lease(max(1, round(ttl)))).id

    async def revoke_lease(self, lease: int) -> None:
        """Revokes `lease` (its keys go with it); a lease already gone is no error."""
        with contextlib.suppress(aetcd.ClientError):
            await self.client.revoke_lease(lease)

    async def refresh_lease(self, lease: int, *, wait: bool = True) -> float:
        """Refreshes `lease`; its remaining TTL, <= 0 when it had lapsed. Without `wait`
        the refresh is only sent, and the answer is `inf` (not known, not waited for)."""
        if not wait:
            self.keeper.refresh_soon(lease)
            return math.inf
        with _etcd_answers("a lease refresh"):
            return await self.keeper.refresh(lease)

    # -- reading --

    async def load(self, mirror: MarkMirror | None = None) -> Snapshot:
        """The job's keys at one revision. The done marks (up to one per task: a failover
        late in a big epoch finds a million) come from `mirror` where it has them as of our
        election (`master.mirror`), else are read apart, in many small ranges at once:
        etcd 3.4 walks the whole rest of a range for each page it answers, so one paged
        range over them costs O(marks^2)."""
        prefix = self.keys.prefix
        with _etcd_answers("the job's keys"):
            head, revision = await read_range(self.client, prefix, prefix + b"done/")
            tail, _ = await read_range(self.client, prefix + b"done0", prefix_range_end(prefix),
                                       revision=revision)
        snap = Snapshot(revision=revision)
        plen = len(prefix)
        pieces: list[tuple[bytes, bytes]] = []
        restart: dict | None = None
        extents: list[tuple[int, int, tuple[int, int, int]]] = []  # (epoch, unit, extent)
        marks: list = []  # failures keys: up to one per task, read below without decoding
        epoch_revision = phase_revision = 0  # the keys' mod revisions (0: absent)
        for kv in (*head, *tail):
            if kv.key.startswith(b"failures/", plen):
                marks.append(kv)
                continue
            parts = kv.key[plen:].decode().split("/")
            kind = parts[0]
            if kind == "spec":
                snap.spec = DatasetSpec.from_json(kv.value)
            elif kind == "files":
                pieces.append((kv.key, kv.value))
            elif kind == "epoch":
                snap.epoch = int(kv.value)
                epoch_revision = kv.mod_revision
            elif kind == "phase":
                snap.phase = Phase(kv.value.decode())
                phase_revision = kv.mod_revision
            elif kind == "trainers":
                snap.trainers["/".join(parts[1:])] = int(kv.value)
            elif kind == "superseded":
                snap.superseded[int(parts[1])] = kv.value.decode()
            elif kind == "assign":
                raw = json.loads(kv.value)
                snap.assignments[int(parts[1])] = Assignment(
                    session=raw["session"], trainer=raw["trainer"],
                    attempt=kv.mod_revision, deadline=raw["deadline"])
            elif kind == "pservers":
                snap.pservers[int(parts[1])] = kv.value.decode()
            elif kind == "restart":
                restart = json.loads(kv.value)
            elif kind == "extents":
                raw = json.loads(kv.value)
                extents.append((int(parts[1]), int(parts[2]), (raw["task"], raw["lo"], raw["hi"])))
        if snap.phase is Phase.SUCCEEDED and phase_revision == epoch_revision:
            # Written in the data's end's own transaction, as older masters did: the data's end,
            # not a deployer's verdict (a verdict is a write of its own); trainers may still run.
            snap.phase = None
        for _, value in sorted(pieces):
            snap.files.extend(FileEntry(p, s) for p, s in json.loads(value))
        snap.extents = {unit: extent for epoch, unit, extent in extents if epoch == snap.epoch}
        if snap.epoch is not None:
            failures = prefix + b"failures/%d/" % snap.epoch
            flen = len(failures)
            for kv in marks:
                if kv.key.startswith(failures):
                    snap.failures[int(kv.key[flen:])] = int(kv.value)
            mirrored = None if mirror is None else await mirror.marks(
                snap.epoch, revision=self.leadership.create_revision)
            snap.mirrored = mirrored is not None
            if mirrored is not None:
                snap.done = mirrored
            else:
                with _etcd_answers("the done marks"):
                    snap.done = await read_done_marks(self.client, self.keys, snap.epoch, revision)
            if restart is not None and restart["epoch"] == snap.epoch:
                # a bigger restart whose marks were not all written: its list is the truth
                snap.done = sorted(set(snap.done) | {int(t) for t in restart["done"]})
        return snap

    async def pservers(self) -> list[str]:
        """The registered pservers' endpoints, by index."""
        prefix = self.keys.kind_prefix("pservers")
        with _etcd_answers("the pservers"):
            kvs, _ = await read_range(self.client, prefix, prefix_range_end(prefix))
        return [kv.value.decode() for kv in sorted(kvs, key=lambda kv: self.keys.task_of(kv.key))]

    async def save_model_holder(self) -> str | None:
        """The trainer that holds the save-model grant, if one does."""
        with _etcd_answers("the save-model grant"):
            current = await self.client.get(self.keys.save_model)
        return current.value.decode() if current is not None else None

    async def confirm_leadership(self) -> None:
        """Raises NotLeader (naming the leader when one is known) unless our leadership stands."""
        with _etcd_answers("the leader key"):
            current = await self.client.get(self.keys.leader)
        if current is None or current.create_revision != self.leadership.create_revision:
            raise NotLeader(current.value.decode() if current is not None else None)

    async def ended_sessions(self, start_revision: int) -> AsyncIterator[int]:
        """The sessions whose `trainers/<id>` key etcd deletes from `start_revision` on
        (a lease lapsed or was revoked), as they go."""
        prefix = self.keys.kind_prefix("trainers")
        watch = await self.client.watch(prefix, range_end=prefix_range_end(prefix),
                                        start_revision=start_revision, prev_kv=True)
        async for event in watch:
            if event.kind == "DELETE" and event.prev_kv is not None:
                yield int(event.prev_kv.value)
