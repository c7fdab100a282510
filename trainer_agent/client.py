"""The trainer's side of the master API: sessions, task iteration, acknowledgements.

    client = TaskClient.from_env()
    for epoch in client.epochs():          # starts at the master's current epoch
        for record in epoch.records():     # tasks fetched, read, acknowledged for you
            train_step(record)

A task is acknowledged only once all its records were consumed: the ack rides on the
next `GetTask` (one call per task in steady state), and `close()` flushes what is left
with `TaskFinished`. A reader or parse error reports `TaskFailed`; any other way out
of the loop while a task is open (an exception in the user's code, Ctrl-C, `break`)
gives the open and prefetched tasks back with `ReturnTask` and lets the exception go on.

While a task is consumed the next one is fetched in a background thread, so the
trainer does not idle on the network. A session expired at the master (NOT_FOUND) is
registered again; a superseded one (FAILED_PRECONDITION) stops this client with
`TrainerSuperseded`: another process uses the same trainer id. UNAVAILABLE (a standby,
a failover, a restart) re-resolves the leader and retries with backoff, keeping the
session, until `deadline` seconds have passed.

What this does NOT guarantee: that a record is *read* once. A trainer that dies after
reading part of a task has those records read again by whoever takes the task next;
what is exactly once is the master's count of finished tasks per epoch.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_random_exponential,
)

from paddlecloud.api import pb, pb_grpc
from trainer_agent.discovery import DiscoveryError, MasterLocator
from trainer_agent.readers import DataError, read_chunk

logger = logging.getLogger(__name__)

CALL_TIMEOUT = 15.0
_TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
_LEADER_HINT = "not the leader; the leader is "


class MasterUnavailable(RuntimeError):
    """The master did not answer within the deadline; the message names where it looked."""


class TrainerSuperseded(RuntimeError):
    """Another process registered the same trainer id: this one must stop."""


class AllTasksFailed(RuntimeError):
    """Every task of an epoch failed: the job has failed."""


def _transient(error: BaseException) -> bool:
    return isinstance(error, DiscoveryError) or (
        isinstance(error, grpc.RpcError) and error.code() in _TRANSIENT)


class MasterConnection:
    """A channel to the current leader, re-resolved on UNAVAILABLE, with retries."""

    def __init__(self, locator: MasterLocator, *, deadline: float) -> None:
        self.locator = locator
        self.deadline = deadline
        self.address: str | None = None
        # One channel per address, kept until close(): the keep-alive and prefetch threads
        # may still be calling on a channel when another thread moves to a new leader.
        self._channels: dict[str, grpc.Channel] = {}
        self._stub: pb_grpc.MasterStub | None = None
        self._lock = threading.Lock()

    def _connect(self, address: str | None = None) -> pb_grpc.MasterStub:
        with self._lock:
            address = address or self.locator.resolve()
            if address not in self._channels:
                self._channels[address] = grpc.insecure_channel(address)
            self.address = address
            self._stub = pb_grpc.MasterStub(self._channels[address])
            return self._stub

    def _after_failure(self, error: BaseException | None) -> None:
        """Points the next attempt at the leader the error named, or re-resolves."""
        hint = None
        if isinstance(error, grpc.RpcError) and (error.details() or "").startswith(_LEADER_HINT):
            hint = error.details()[len(_LEADER_HINT):]
        with self._lock:
            self._stub = None
        if hint and hint != "unknown" and not self.locator.master_endpoint:
            try:
                self._connect(hint)
            except DiscoveryError:
                pass

    def call(self, method: str, request: Any, *, timeout: float = CALL_TIMEOUT) -> Any:
        retrying = Retrying(
            retry=retry_if_exception(_transient), stop=stop_after_delay(self.deadline),
            wait=wait_random_exponential(multiplier=0.05, max=2.0), reraise=False,
            before_sleep=lambda state: self._after_failure(state.outcome.exception()),
        )
        try:
            for attempt in retrying:
                with attempt:
                    stub = self._stub or self._connect()
                    return getattr(stub, method)(request, timeout=timeout)
        except RetryError as error:
            last = error.last_attempt.exception()
            detail = last.details() if isinstance(last, grpc.RpcError) else str(last)
            raise MasterUnavailable(
                f"master unreachable at {self.address or self.locator.describe()} for "
                f"{self.deadline:g}s: {detail}") from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
            self._stub = None


def _seconds(value: Duration) -> float:
    return value.seconds + value.nanos / 1e9


def _ref(task: pb.Task) -> pb.TaskRef:
    return pb.TaskRef(task_id=task.id, epoch=task.epoch, attempt=task.attempt)


def _report(session: int, task: pb.Task, reason: str = "") -> pb.TaskReport:
    return pb.TaskReport(session_id=session, task_id=task.id, epoch=task.epoch,
                         attempt=task.attempt, reason=reason)


class TaskClient:
    def __init__(self, *, trainer_id: str, locator: MasterLocator,
                 parse: Callable[[Any], Any] | None = None, deadline: float = 300.0,
                 prefetch: bool = True) -> None:
        if not trainer_id:
            raise ValueError("trainer_id is empty: set PADDLE_TRAINER_ID or pass trainer_id")
        self.trainer_id = trainer_id
        self.parse = parse
        self.prefetch = prefetch
        self.connection = MasterConnection(locator, deadline=deadline)
        self.session_id = 0
        self.ttl = 10.0
        self.current_epoch = 0
        self.num_epochs = 0
        self.job_done = False
        self.stats = {"accepted": 0, "stale": 0, "failed": 0, "returned": 0, "reregistered": 0}
        self._acks: list[pb.TaskRef] = []
        self._open: dict[int, pb.Task] = {}           # tasks held: being read or prefetched
        self._settled: deque[tuple[int, int]] = deque(maxlen=64)  # (task, attempt) we let go of
        self._lock = threading.RLock()
        self._superseded: TrainerSuperseded | None = None
        self._closed = threading.Event()
        self._keepalive: threading.Thread | None = None
        self._fetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="task-prefetch")
        # Sees every GetTask reply first and may replace it (e.g. a loader worker that
        # leaves its epoch to a sibling: trainer_agent.paddle).
        self.reply_filter: Callable[[pb.GetTaskResponse], pb.GetTaskResponse] | None = None

    @classmethod
    def from_env(cls, *, trainer_id: str | None = None, parse: Callable[[Any], Any] | None = None,
                 deadline: float | None = None, prefetch: bool = True) -> TaskClient:
        """Reads DESIGN.md section 8's variables: PADDLE_TRAINER_ID, PADDLE_MASTER_ENDPOINT,
        PADDLE_ETCD_ENDPOINTS, PADDLE_JOB_NAME, PADDLE_NAMESPACE (and PADDLECLOUD_MASTER_DEADLINE)."""
        env = os.environ
        locator = MasterLocator(
            master_endpoint=env.get("PADDLE_MASTER_ENDPOINT") or None,
            etcd_endpoints=env.get("PADDLE_ETCD_ENDPOINTS") or None,
            job=env.get("PADDLE_JOB_NAME") or None,
            namespace=env.get("PADDLE_NAMESPACE") or "local",
        )
        trainer_id = trainer_id or env.get("PADDLE_TRAINER_ID") or f"{socket.gethostname()}-{os.getpid()}"
        if deadline is None:
            deadline = float(env.get("PADDLECLOUD_MASTER_DEADLINE", "300"))
        return cls(trainer_id=trainer_id, locator=locator, parse=parse, deadline=deadline,
                   prefetch=prefetch)

    # ---- session ----------------------------------------------------------------

    def register(self) -> None:
        reply = self.connection.call("RegisterTrainer", pb.RegisterTrainerRequest(trainer_id=self.trainer_id))
        with self._lock:
            self.session_id = reply.session_id
            self.ttl = _seconds(reply.ttl) or 10.0
            self.current_epoch = reply.current_epoch
            self.num_epochs = reply.num_epochs
            self._open.clear()  # whatever the old session held went back to the master
        logger.info("trainer %s registered (session %d, epoch %d)", self.trainer_id,
                    self.session_id, self.current_epoch)
        if self._keepalive is None:
            self._keepalive = threading.Thread(target=self._keep_alive, name="session-keepalive",
                                               daemon=True)
            self._keepalive.start()

    def _keep_alive(self) -> None:
        while not self._closed.wait(self.ttl / 3):
            try:
                self._with_session(lambda s: self.connection.call(
                    "KeepAlive", pb.KeepAliveRequest(session_id=s)))
            except TrainerSuperseded:
                return
            except Exception as error:  # the main loop sees the same problem on its next call
                logger.warning("keep-alive failed: %s", error)

    def _with_session(self, call: Callable[[int], Any]) -> Any:
        """Runs `call(session_id)`; registers again once if the session expired."""
        if self._superseded is not None:
            raise self._superseded
        if not self.session_id:
            self.register()
        session = self.session_id
        try:
            return call(session)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.FAILED_PRECONDITION and "superseded" in (error.details() or ""):
                self._superseded = TrainerSuperseded(
                    f"trainer {self.trainer_id}: {error.details()}; another process uses this trainer id")
                raise self._superseded from None
            if error.code() != grpc.StatusCode.NOT_FOUND:
                raise
            with self._lock:
                if self.session_id == session:  # not yet re-registered by another thread
                    logger.warning("session %d expired; registering again", session)
                    self.stats["reregistered"] += 1
                    self.register()
            return call(self.session_id)

    # ---- tasks ------------------------------------------------------------------

    def _get_task(self, epoch: int) -> pb.GetTaskResponse:
        with self._lock:
            acks, self._acks = self._acks, []
        try:
            reply = self._with_session(lambda s: self.connection.call(
                "GetTask", pb.GetTaskRequest(session_id=s, epoch=epoch, finished=acks)))
        except BaseException:
            with self._lock:
                self._acks[:0] = acks  # not known to be delivered: send them again
            raise
        self._count_results(reply.finished_results)
        if self.reply_filter is not None:
            reply = self.reply_filter(reply)
        return reply

    @property
    def holding(self) -> bool:
        """True while this client holds a task (being read, or prefetched)."""
        return bool(self._open)

    def _count_results(self, results) -> None:
        for result in results:
            self.stats["accepted" if result == pb.ACCEPTED else "stale"] += 1

    def _fetch(self, epoch: int) -> Future:
        return self._fetcher.submit(self._get_task, epoch)

    def _let_go(self, task: pb.Task) -> pb.Task | None:
        with self._lock:
            self._settled.append((task.id, task.attempt))
            return self._open.pop(task.id, None)

    def holds_or_settled(self, task: pb.Task) -> bool:
        """A task the master re-sent because it thinks we hold it: nothing new to read."""
        return task.id in self._open or (task.id, task.attempt) in self._settled

    def _ack(self, task: pb.Task) -> None:
        self._let_go(task)
        with self._lock:
            self._acks.append(_ref(task))

    def _fail(self, task: pb.Task, reason: str) -> None:
        self._let_go(task)
        logger.warning("task %d failed: %s", task.id, reason)
        self.stats["failed"] += 1
        self._with_session(lambda s: self.connection.call("TaskFailed", _report(s, task, reason)))

    def _give_back(self, task: pb.Task) -> None:
        if self._let_go(task) is None:
            return
        self.stats["returned"] += 1
        try:
            self._with_session(lambda s: self.connection.call("ReturnTask", _report(s, task), timeout=5))
        except Exception as error:  # the lease returns it anyway when this process is gone
            logger.warning("could not return task %d: %s", task.id, error)

    def flush(self) -> None:
        """Reports every acknowledged task not yet delivered, with TaskFinished."""
        with self._lock:
            acks, self._acks = self._acks, []
        for ref in acks:
            reply = self._with_session(lambda s, ref=ref: self.connection.call(
                "TaskFinished", pb.TaskReport(session_id=s, task_id=ref.task_id, epoch=ref.epoch,
                                              attempt=ref.attempt)))
            self._count_results([reply.result])

    def epochs(self) -> Iterator[Epoch]:
        """One `Epoch` per epoch of the job, from the master's current one, until JOB_DONE."""
        if not self.session_id:
            self.register()
        while not self.job_done and not (self.num_epochs and self.current_epoch >= self.num_epochs):
            epoch = Epoch(self, self.current_epoch)
            yield epoch
            if not epoch.ended:
                return  # the caller stopped reading mid-epoch
            self.flush()

    def request_save_model(self, *, block: float = 60.0) -> bool:
        """True when this trainer is the one to save the model now (one at a time, for `block`)."""
        whole = int(block)
        duration = Duration(seconds=whole, nanos=int((block - whole) * 1e9))
        reply = self._with_session(lambda s: self.connection.call(
            "RequestSaveModel", pb.RequestSaveModelRequest(session_id=s, block=duration)))
        return reply.granted

    def close(self) -> None:
        """Flushes acknowledgements, gives held tasks back, and leaves (tasks return at once)."""
        if self._closed.is_set():
            return
        try:
            if self.session_id and self._superseded is None:
                for task in list(self._open.values()):
                    self._give_back(task)
                self.flush()
                self.connection.call("LeaveTrainer", pb.LeaveTrainerRequest(session_id=self.session_id),
                                     timeout=5)
        except Exception as error:
            logger.warning("leaving the master failed: %s (the session lease will lapse)", error)
        finally:
            self._closed.set()
            self._fetcher.shutdown(wait=False, cancel_futures=True)
            self.connection.close()

    def __enter__(self) -> TaskClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Epoch:
    """One epoch's worth of records, as this trainer gets them."""

    def __init__(self, client: TaskClient, number: int) -> None:
        self.client = client
        self.number = number
        self.ended = False
        self.tasks_read = 0
        self.current_task: pb.Task | None = None  # the task whose records are being read

    def __repr__(self) -> str:
        return f"Epoch({self.number})"

    def records(self) -> Iterator[Any]:
        client = self.client
        pending: Future | None = client._fetch(self.number)
        current: pb.Task | None = None
        try:
            while pending is not None:
                reply = pending.result()
                pending = None
                outcome = reply.outcome
                if outcome == pb.TASK:
                    task = reply.task
                    if client.holds_or_settled(task):  # re-sent: nothing new for us yet
                        time.sleep(0.05)
                        pending = client._fetch(self.number)
                        continue
                    current = task
                    client._open[task.id] = task
                    if client.prefetch:
                        pending = client._fetch(self.number)
                    yield from self._read(task)
                    current = None
                    if pending is None:
                        pending = client._fetch(self.number)
                elif outcome == pb.WAIT:
                    if not client._acks:  # news to deliver goes at once; otherwise back off
                        time.sleep(_seconds(reply.retry_after) * random.uniform(0.5, 1.5))
                    pending = client._fetch(self.number)
                elif outcome == pb.EPOCH_DONE:
                    client.current_epoch = reply.current_epoch
                elif outcome == pb.JOB_DONE:
                    client.job_done = True
                    client.current_epoch = max(client.current_epoch, reply.current_epoch)
                elif outcome == pb.ALL_TASKS_FAILED:
                    raise AllTasksFailed(f"every task of epoch {reply.current_epoch} failed: the job failed")
            self.ended = True
        except BaseException:
            # break, an exception in the caller's loop, Ctrl-C: give back what we hold.
            if current is not None:
                client._give_back(current)
            if pending is not None:
                try:
                    reply = pending.result(timeout=CALL_TIMEOUT)
                    if reply.outcome == pb.TASK:
                        client._open.setdefault(reply.task.id, reply.task)
                        client._give_back(reply.task)
                except Exception:
                    pass
            raise

    def _read(self, task: pb.Task) -> Iterator[Any]:
        client = self.client
        parse = client.parse
        self.current_task = task
        try:
            for chunk in task.chunks:
                for raw in read_chunk(chunk, task.format or "lines"):
                    record = parse(raw) if parse is not None else raw
                    yield record
        except (DataError, ValueError, KeyError, TypeError, UnicodeError) as error:
            # The data is at fault (a reader or parse error): count a failure for the task.
            client._fail(task, f"{type(error).__name__}: {error}")
            return
        self.tasks_read += 1
        client._ack(task)
