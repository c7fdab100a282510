"""The trainer's side of the master API: sessions, task iteration, acknowledgements.

    client = TaskClient.from_env()
    for epoch in client.epochs():          # starts at the master's current epoch
        for record in epoch.records():     # tasks fetched, read, acknowledged for you
            train_step(record)

A task is acknowledged only once all its records were consumed: the ack rides on the
next `GetTask` (one per task in steady state; they go over one `GetTaskStream` per
session, which costs the master a fraction of a unary call), and `close()` flushes what is left
with `TaskFinished`. A reader or parse error reports `TaskFailed`; any other way out
of the loop while a task is open (an exception in the user's code, Ctrl-C, `break`)
gives the open and prefetched tasks back with `ReturnTask` and lets the exception go on.

While a task is consumed the next one is fetched in a background thread, so the
trainer does not idle on the network. With `max_tasks` > 1 one GetTask may bring up to
that many tasks (never past the master's --max-tasks-per-trainer); they are read in
turn, the next fetch starts with the last of them, and it carries all their acks. The client acts on the reason the master gives
in the error's `google.rpc.ErrorInfo` (`paddlecloud.wire`), never on its text: a
session expired (SESSION_EXPIRED) is registered again; a superseded one
(SESSION_SUPERSEDED) stops this client with `TrainerSuperseded`: another process uses
the same trainer id. UNAVAILABLE (a standby, a failover, a restart) retries with
backoff, keeping the session, until `deadline` seconds have passed: at the leader a
standby names (NOT_LEADER's `leader`), else at a freshly resolved one.

Threads, and who owns what. Three threads use a client: the main thread (the training
loop: `epochs()`, `Epoch.records()`, `flush()`, `close()`), the keep-alive thread
(`KeepAlive` when no call carrying the session was answered for ttl/3, so a trainer
that calls GetTask more often sends none; it registers again when the session expired) and the
prefetch thread (the next `GetTask` while a task is read; it may register again too).
Each piece of state has one owner that guards it with its own lock:

* `MasterConnection`: the channels, one per address and kept until `close()` (a thread
  may still be calling on the old one when another moves to a new leader), and which
  one is current.
* `Session`: the session id and TTL, the supersession, the keep-alive thread. The
  first thread to hear SESSION_EXPIRED registers again; the others use the new id.
* `TaskLedger`: the tasks held (being read or prefetched), those let go of lately, and
  the acknowledgements not yet delivered. The main thread holds and lets go; the
  prefetch thread takes the acks for its GetTask (and puts them back when the call
  failed); a registration, from any thread, forgets what the old session held.
* `TaskClient`: where the job is as last heard (`progress`: an immutable snapshot,
  replaced under the client's lock by registrations and by the main thread at the
  ends of epochs) and the counters.

The keep-alive thread also answers the master's work-stealing requests (`Steals`,
trainer_agent.stealing: a KeepAlive's `split_requests`), holding the reader of the
task in question at its position until the master's word is in.

Locks nest only in that order (a Session's, then a connection's, ledger's or
client's). Held across a call to the network: the Session's lock while it registers
(one registration at a time; the other threads wait for its id), the connection's
while it resolves the leader in etcd, and a `TaskStream`'s while one GetTask on it is
answered (taken last, under none of the others); no other.
`Epoch` owns nothing shared: it uses the client's and the ledger's public methods.

What this does NOT guarantee: that a record is *read* once. A trainer that dies after
reading part of a task has those records read again by whoever takes the task next;
what is exactly once is the master's count of finished tasks per epoch.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import random
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import grpc
from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_random_exponential,
)

from paddlecloud.api import pb, pb_grpc
from paddlecloud.auth import ClientCredentials
from paddlecloud.master_client.connection import reason_of as _reason
from paddlecloud.master_client.connection import retry_delay
from paddlecloud.master_client.discovery import DiscoveryError, MasterLocator
from paddlecloud.wire import Reason, duration, seconds
from trainer_agent import termination
from trainer_agent.readers import DataError
from trainer_agent.stealing import Steals

logger = logging.getLogger(__name__)

# How long one attempt of a call may take. Long: a call waits its turn in a busy master's
# queue (about N / throughput: over 10 s with 10,000 trainers on a small master), and one
# cut off there goes to the back of it again. A master gone without closing the connection (its
# node lost, its process stopped) is noticed sooner, by keep-alive pings that go
# unanswered (`paddlecloud.wire.CLIENT_KEEPALIVE`: within 15 s).
CALL_TIMEOUT = 60.0
LAST_ATTEMPT = 1.0  # the least time one attempt is given, however little of `deadline` is left
BEAT_RECHECK = 1.0  # seconds between looks at a session whose call is under way (Session)
# The longest wait between two attempts of a call (full-jitter exponential backoff from 50 ms):
# a new leader is noticed within about this long of serving (the failover goal of
# docs/benchmarks.md is the election TTL + 2 s), while a standby, cheap to answer, takes at
# most ~1 call per trainer per second until then.
RETRY_CAP = 1.0
EXPIRED_RETRIES = 3  # registrations again within one call whose session keeps expiring
# Codes a call is retried on: the master is away (UNAVAILABLE), slow (DEADLINE_EXCEEDED),
# shedding load on purpose (RESOURCE_EXHAUSTED), or the call was cancelled on the way
# (CANCELLED: gRPC's own queues, a connection reset) while this client did not cancel it.
_TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED})

T = TypeVar("T")


class MasterUnavailable(RuntimeError):
    """The master did not answer within the deadline; the message names where it looked."""


class ConnectionClosed(RuntimeError):
    """A call on a `MasterConnection` after its `close()`."""


class TrainerSuperseded(RuntimeError):
    """Another process registered the same trainer id: this one must stop."""


class AllTasksFailed(RuntimeError):
    """Every task of an epoch failed: the job has failed."""


def default_trainer_id() -> str:
    """`$PADDLE_TRAINER_ID`, else `<host>-<pid>`."""
    return os.environ.get("PADDLE_TRAINER_ID") or f"{socket.gethostname()}-{os.getpid()}"




def _report(session: int, task: pb.Task, reason: str = "") -> pb.TaskReport:
    return pb.TaskReport(session_id=session, task_id=task.id, epoch=task.epoch,
                         attempt=task.attempt, reason=reason)


class _StreamError(grpc.RpcError):
    """A task stream that ended without the master's status: no reply in time, or none at all."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> None:  # no ErrorInfo or RetryInfo: the master said nothing
        return None


_END = object()  # ends a task stream's requests


class TaskStream:
    """One `GetTaskStream` of one session at one master: `ask` sends a GetTask and waits for
    its answer, at most `wait` seconds; answers come in the order of the requests.

    A message on an open stream costs the master a fraction of a unary call
    (docs/benchmarks.md). gRPC's synchronous stack reads the requests in a thread of its own;
    one more thread reads the answers into a queue, so that `ask` can give up in time. A
    stream that failed is done: `ask` raises the master's status (or DEADLINE_EXCEEDED when
    no answer came in time), and the connection opens another for the next call.
    """

    def __init__(self, stub: pb_grpc.MasterStub, session: int, metadata: tuple[tuple[str, str], ...]) -> None:
        self.stub, self.session = stub, session
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._replies: queue.SimpleQueue = queue.SimpleQueue()
        self._ended: BaseException | None = None
        self._asking = threading.Lock()
        self._call = stub.GetTaskStream(iter(self._requests.get, _END), metadata=metadata)
        threading.Thread(target=self._read, name=f"task-stream-{session}", daemon=True).start()

    def _read(self) -> None:
        try:
            for reply in self._call:
                self._replies.put(reply)
            self._replies.put(_StreamError(grpc.StatusCode.UNAVAILABLE, "the master ended the task stream"))
        except grpc.RpcError as error:
            self._replies.put(error)
        finally:
            self._requests.put(_END)  # gRPC's request thread stops too

    def ask(self, request: pb.GetTaskRequest, wait: float) -> pb.GetTaskResponse:
        with self._asking:  # one request at a time: each answer is the one for this request
            if self._ended is not None:
                raise self._ended
            self._requests.put(request)
            try:
                item = self._replies.get(timeout=wait)
            except queue.Empty:
                item = _StreamError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                    f"no answer on the task stream in {wait:g}s")
            if isinstance(item, BaseException):
                self._ended = item
                self.close()
                raise item
            return item

    def close(self) -> None:
        self._requests.put(_END)
        self._call.cancel()


class MasterConnection:
    """Calls to the job's leading master: one typed method per RPC a trainer makes.

    Each call retries UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED (a saturated
    master sheds load: it waits the RetryInfo delay the master gives, jittered) and
    CANCELLED unless this connection was closed (and a leader not found in etcd) with
    jittered backoff until `deadline` seconds have passed, then raises
    `MasterUnavailable`; between attempts it follows a standby's NOT_LEADER hint
    (unless the locator is a fixed endpoint, e.g. a Service), else resolves the leader
    again (a master that did not answer at all is avoided while etcd still names it: a
    standby holds the call instead). The backoff is spent by the time the attempts took
    since the last wait, so a call a master held goes again at once. `credentials`
    (default: `ClientCredentials.from_env()`) open the channels (TLS with the master's CA)
    and authenticate the calls: the job's token, and for a session the session token its
    registration returned. Thread-safe.
    """

    def __init__(self, locator: MasterLocator, *, deadline: float,
                 credentials: ClientCredentials | None = None,
                 open_channel: Callable[[str], grpc.Channel] | None = None) -> None:
        self.locator = locator
        self.deadline = deadline
        self.credentials = credentials if credentials is not None else ClientCredentials.from_env()
        self._open_channel = open_channel or self.credentials.channel
        self._session_tokens: dict[int, str] = {}  # session id -> its token (RegisterTrainer's reply)
        self._lock = threading.Lock()
        # One channel per address, kept until close(): the keep-alive and prefetch threads
        # may still be calling on a channel when another thread moves to a new leader.
        self._channels: dict[str, grpc.Channel] = {}
        self._address: str | None = None
        self._unanswered: str | None = None  # a master that did not answer the last attempt at it
        self._stub: pb_grpc.MasterStub | None = None
        self._closed = False
        # GetTask goes over one stream of the current session at the current master; unary
        # once a master answered UNIMPLEMENTED (one from before GetTaskStream).
        self._stream: TaskStream | None = None
        self._streaming = True

    @property
    def address(self) -> str | None:
        """The master's address the next call goes to (None before the first)."""
        with self._lock:
            return self._address

    # ---- the RPCs ------------------------------------------------------------------

    def _as(self, session: int | None = None) -> tuple[tuple[str, str], ...]:
        """The call's metadata: the session's token, else the job's token."""
        with self._lock:
            token = self._session_tokens.get(session) if session else None
        return self.credentials.metadata(token)

    def register_trainer(self, trainer_id: str) -> pb.RegisterTrainerResponse:
        request = pb.RegisterTrainerRequest(trainer_id=trainer_id)
        reply = self._call(lambda stub, wait: stub.RegisterTrainer(request, timeout=wait, metadata=self._as()))
        if reply.session_token:
            with self._lock:
                self._session_tokens[reply.session_id] = reply.session_token
        return reply

    def keep_alive(self, session: int) -> pb.KeepAliveResponse:
        return self._call(lambda stub, wait: stub.KeepAlive(pb.KeepAliveRequest(session_id=session),
                                                            timeout=wait, metadata=self._as(session)))

    def split_task(self, session: int, ref: pb.TaskRef, position: int) -> int:
        """SplitTask (work stealing: trainer_agent.stealing): the master's SplitAnswer."""
        request = pb.SplitTaskRequest(session_id=session, task_id=ref.task_id, epoch=ref.epoch,
                                      attempt=ref.attempt, position=position)
        return self._call(lambda stub, wait: stub.SplitTask(request, timeout=wait,
                                                            metadata=self._as(session))).answer

    def leave_trainer(self, session: int, *, timeout: float) -> None:
        self._call(lambda stub, wait: stub.LeaveTrainer(pb.LeaveTrainerRequest(session_id=session),
                                                        timeout=min(timeout, wait), metadata=self._as(session)))

    def get_task(self, session: int, *, epoch: int, finished: list[pb.TaskRef],
                 max_tasks: int = 1) -> pb.GetTaskResponse:
        """The next task of `epoch` (up to `max_tasks`: `task` and `more_tasks`), or why there
        is none; `finished` acknowledges tasks read."""
        request = pb.GetTaskRequest(session_id=session, epoch=epoch, finished=finished,
                                    max_tasks=max_tasks)
        return self._call(lambda stub, wait: self._get_task(stub, session, request, wait))

    def _get_task(self, stub: pb_grpc.MasterStub, session: int, request: pb.GetTaskRequest,
                  wait: float) -> pb.GetTaskResponse:
        """One GetTask over the session's task stream, else (a master without one) unary."""
        stream = self._task_stream(stub, session)
        if stream is not None:
            try:
                return stream.ask(request, wait)
            except grpc.RpcError as error:
                with self._lock:
                    if self._stream is stream:
                        self._stream = None
                    if error.code() is not grpc.StatusCode.UNIMPLEMENTED:
                        raise
                    self._streaming = False
                logger.info("the master at %s has no GetTaskStream: GetTask goes unary", self.address)
        return stub.GetTask(request, timeout=wait, metadata=self._as(session))

    def _task_stream(self, stub: pb_grpc.MasterStub, session: int) -> TaskStream | None:
        """The open stream of `session` at `stub`'s master; a new one when the master or the
        session changed (the old one is closed); None once streams are not served."""
        with self._lock:
            current = self._stream
            if not self._streaming or self._closed:
                return None
            if current is not None and current.stub is stub and current.session == session:
                return current
        metadata = self._as(session)  # only for a new stream: not on every GetTask
        with self._lock:
            if self._closed:
                return None
            old, self._stream = self._stream, TaskStream(stub, session, metadata)
            stream = self._stream
        if old is not None:
            old.close()
        return stream

    def task_finished(self, session: int, ref: pb.TaskRef) -> pb.ReportResult:
        request = pb.TaskReport(session_id=session, task_id=ref.task_id, epoch=ref.epoch, attempt=ref.attempt)
        return self._call(lambda stub, wait: stub.TaskFinished(request, timeout=wait,
                                                         metadata=self._as(session))).result

    def task_failed(self, session: int, task: pb.Task, *, reason: str) -> None:
        self._call(lambda stub, wait: stub.TaskFailed(_report(session, task, reason), timeout=wait,
                                                metadata=self._as(session)))

    def return_task(self, session: int, task: pb.Task, *, timeout: float) -> None:
        self._call(lambda stub, wait: stub.ReturnTask(_report(session, task), timeout=min(timeout, wait),
                                                metadata=self._as(session)))

    def request_save_model(self, session: int, *, block: float) -> bool:
        """True when this session's trainer is granted the save for `block` seconds."""
        request = pb.RequestSaveModelRequest(session_id=session, block=duration(block))
        return self._call(lambda stub, wait: stub.RequestSaveModel(request, timeout=wait,
                                                             metadata=self._as(session))).granted

    def get_status(self) -> pb.GetStatusResponse:
        return self._call(lambda stub, wait: stub.GetStatus(pb.GetStatusRequest(), timeout=wait,
                                                      metadata=self._as()))

    # ---- retries and the leader -----------------------------------------------------

    def _transient(self, error: BaseException) -> bool:
        """Worth another attempt: see the class docstring. A call cancelled because this
        connection closed is not (the client caused it)."""
        if isinstance(error, DiscoveryError):
            return True
        if not isinstance(error, grpc.RpcError) or error.code() not in _TRANSIENT:
            return False
        if error.code() is grpc.StatusCode.CANCELLED:
            with self._lock:
                return not self._closed
        return True

    def _call(self, invoke: Callable[[pb_grpc.MasterStub, float], T]) -> T:
        """`invoke(stub, seconds)`, retried while the master is away or busy until `deadline`;
        one attempt waits at most CALL_TIMEOUT seconds, and never past that deadline."""
        backoff = wait_random_exponential(multiplier=0.05, max=RETRY_CAP)
        give_up = time.monotonic() + self.deadline
        credit = 0.0  # seconds the attempts took that no wait has counted yet
        sent = time.monotonic()  # when the last attempt was sent
        used: str | None = None  # the address of the last attempt

        def wait(state: RetryCallState) -> float:
            """A shedding master's RetryInfo, else the backoff less the time the attempts took
            that no earlier wait counted (gRPC counts its backoff from an attempt's start,
            too): a call a master held (`--failover-hold`) has waited already, and so has the
            quick attempt after it (the leader it named, dead: refused). The credit is spent
            as it is counted, so attempts refused at once, one after another, back off."""
            nonlocal credit
            error = state.outcome.exception() if state.outcome is not None else None
            credit += time.monotonic() - sent
            asked = retry_delay(error)
            if asked:
                return asked
            delay = backoff(state)
            spent = min(credit, delay)
            credit -= spent
            return delay - spent

        retrying = Retrying(
            retry=retry_if_exception(self._transient), stop=stop_after_delay(self.deadline),
            wait=wait, reraise=False,
            before_sleep=lambda state: self._after_failure(state, used),
        )
        try:
            for attempt in retrying:
                sent = time.monotonic()
                with attempt:
                    with self._lock:
                        stub, used = self._stub, self._address
                    if stub is None:
                        stub, used = self._connect()
                    wait_s = min(CALL_TIMEOUT, max(LAST_ATTEMPT, give_up - time.monotonic()))
                    reply = invoke(stub, wait_s)
                    if self._unanswered is not None:
                        with self._lock:
                            self._unanswered = None
                    return reply
        except RetryError as error:
            last = error.last_attempt.exception()
            detail = last.details() if isinstance(last, grpc.RpcError) else str(last)
            raise MasterUnavailable(
                f"master unreachable at {self.address or self.locator.describe()} for "
                f"{self.deadline:g}s: {detail}") from None
        raise AssertionError("unreachable")

    def _connect(self, address: str | None = None) -> tuple[pb_grpc.MasterStub, str]:
        """Makes `address` (default: the leader the locator resolves, avoiding a master that
        did not answer while etcd still names it) the current master."""
        with self._lock:
            if self._closed:
                raise ConnectionClosed(f"connection to {self.locator.describe()} is closed")
            address = address or self.locator.resolve(avoid=self._unanswered)
            if address not in self._channels:
                self._channels[address] = self._open_channel(address)
            self._address = address
            self._stub = pb_grpc.MasterStub(self._channels[address])
            return self._stub, address

    def _after_failure(self, attempt: RetryCallState, address: str | None) -> None:
        """Points the next attempt at the leader a standby named, or lets it re-resolve. A
        master at `address` that did not answer at all (UNAVAILABLE with no reason: every
        UNAVAILABLE a master answers itself says why) is avoided while etcd's leader key
        still names it: the next attempt goes to a standby, which holds it until the
        election is decided."""
        error = attempt.outcome.exception() if attempt.outcome is not None else None
        reason, metadata = _reason(error) if error is not None else (None, {})
        leader = metadata.get("leader") if reason is Reason.NOT_LEADER else None
        silent = (reason is None and isinstance(error, grpc.RpcError)
                  and error.code() is grpc.StatusCode.UNAVAILABLE)
        with self._lock:
            self._stub = None
            if silent:
                self._unanswered = address
        if leader and not self.locator.master_endpoint:
            self._connect(leader)

    def close(self) -> None:
        """Closes every channel; later calls raise ConnectionClosed."""
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
            self._stub = None
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        for channel in channels:
            channel.close()


class Session:
    """A trainer's session at the master (`RegisterTrainer`) and the thread that keeps it alive.

    `run(call)` calls `call(session_id)`, registering first when there is no session
    and once more when the master says it expired (SESSION_EXPIRED); once the master
    says it was superseded (SESSION_SUPERSEDED) every `run` raises `TrainerSuperseded`.
    `on_register(reply)` runs after each registration, under this session's lock.
    The keep-alive thread starts with the first registration and stops at `close()`;
    it calls `KeepAlive` only when no call through `run` was answered for ttl/3 (or for
    the master's `split_poll` at an epoch's tail: `beat_every`; any call carrying the
    session refreshes it at the master) and none is under way. A call
    under way refreshes the session when the master takes it up, and a KeepAlive sent
    now would pass the same gate after it: under load (calls queued at the master for
    longer than ttl/3), such KeepAlives would only lengthen the queue that delays them.
    """

    def __init__(self, connection: MasterConnection, *, trainer_id: str,
                 on_register: Callable[[pb.RegisterTrainerResponse], None] | None = None) -> None:
        self.connection = connection
        self.trainer_id = trainer_id
        self._on_register = on_register
        self._lock = threading.RLock()  # held while registering: one registration at a time
        self._id = 0
        self._ttl = 10.0
        self._superseded: TrainerSuperseded | None = None
        self._last_call = 0.0   # monotonic time the last answered call carrying the session was sent
        self._last_beat = 0.0   # ... the keep-alive thread last tried a KeepAlive
        self._under_way = 0     # calls through `run` sent and not yet answered (or failed)
        self.keepalives = 0     # KeepAlive calls sent
        self.reregistrations = 0  # how often an expired session was registered again
        self._closed = threading.Event()
        self._keepalive: threading.Thread | None = None
        # sees each KeepAlive answer, in the keep-alive thread (work stealing's requests)
        self.on_keep_alive: Callable[[pb.KeepAliveResponse], None] | None = None
        self._split_poll = 0.0  # the master's `split_poll`: KeepAlive this often (0: ttl/3)

    @property
    def id(self) -> int:
        """The session id; 0 before the first registration."""
        with self._lock:
            return self._id

    @property
    def active(self) -> bool:
        """Registered and not superseded."""
        with self._lock:
            return bool(self._id) and self._superseded is None

    def register(self) -> None:
        """Registers a new session now (the master drops an older one of this trainer id)."""
        with self._lock:
            sent = time.monotonic()
            reply = self.connection.register_trainer(self.trainer_id)
            self._id = reply.session_id
            self._last_call = sent
            self._ttl = seconds(reply.ttl) or 10.0
            if self._on_register is not None:
                self._on_register(reply)
            termination.track(self)  # stopped with SIGTERM, the process leaves first
            if self._keepalive is None:
                self._keepalive = threading.Thread(target=self._keep_alive, name="session-keepalive",
                                                   daemon=True)
                self._keepalive.start()
        logger.info("trainer %s registered (session %d, epoch %d)", self.trainer_id,
                    reply.session_id, reply.current_epoch)

    def ensure(self) -> int:
        """The session id, registering first when there is no session."""
        with self._lock:
            if self._superseded is not None:
                raise self._superseded
            if not self._id:
                self.register()
            return self._id

    def run(self, call: Callable[[int], T]) -> T:
        """`call(session_id)`; registers again when the session expired meanwhile, up to
        EXPIRED_RETRIES times (a session can lapse again before the retry lands: a pause, a
        master failover between the two calls)."""
        for attempt in range(EXPIRED_RETRIES + 1):
            session = self.ensure()
            sent = time.monotonic()
            self._begin()
            try:
                result = call(session)
                self._answered(sent)
                return result
            except grpc.RpcError as error:
                reason, metadata = _reason(error)
                if reason is Reason.SESSION_SUPERSEDED:
                    with self._lock:
                        self._superseded = TrainerSuperseded(
                            f"trainer {self.trainer_id}: session {session} superseded by a newer "
                            f"session of trainer {metadata.get('trainer', self.trainer_id)}; another "
                            "process uses this trainer id")
                        raise self._superseded from None
                if reason is not Reason.SESSION_EXPIRED or attempt == EXPIRED_RETRIES:
                    raise
            finally:
                self._end()
            with self._lock:
                if self._id == session:  # not yet registered again by another thread
                    logger.warning("session %d expired; registering again", session)
                    self.reregistrations += 1
                    self.register()
        raise AssertionError("unreachable")

    def _begin(self) -> None:
        with self._lock:
            self._under_way += 1

    def _end(self) -> None:
        with self._lock:
            self._under_way -= 1

    def _answered(self, sent: float) -> None:
        with self._lock:
            self._last_call = max(self._last_call, sent)

    def leave(self, *, timeout: float = 5.0) -> None:
        """Ends the session at the master (its tasks return at once)."""
        session = self._id  # no lock: a stopping process leaves while its main thread may hold it
        if session:
            self.connection.leave_trainer(session, timeout=timeout)

    def close(self) -> None:
        """Stops the keep-alive thread: it starts no call after this (one under way ends
        when the connection closes)."""
        self._closed.set()
        termination.untrack(self)

    def beat_every(self, interval: float) -> None:
        """KeepAlive at least this often (the master's `split_poll` at an epoch's tail: its
        answers bring work stealing's split requests); 0: every ttl/3, as usual."""
        with self._lock:
            self._split_poll = interval

    @property
    def beat_interval(self) -> float:
        """Seconds between KeepAlives when no other call carries the session."""
        with self._lock:
            return min(self._ttl / 3, self._split_poll or self._ttl)

    def _next_beat(self) -> float:
        """Seconds until a KeepAlive is due: ttl/3 (or sooner, `beat_every`) after the last
        answered call (or try); while a call is under way, none is due (looked at again in
        BEAT_RECHECK seconds)."""
        with self._lock:
            if self._under_way:
                return min(BEAT_RECHECK, self._ttl / 30)
            interval = min(self._ttl / 3, self._split_poll or self._ttl)  # as `beat_interval`
            return max(self._last_call, self._last_beat) + interval - time.monotonic()

    def _keep_alive(self) -> None:
        # looked at again at least every BEAT_RECHECK seconds: `beat_every` may shorten the beat
        while not self._closed.wait(min(BEAT_RECHECK, max(0.0, self._next_beat()))):
            if self._next_beat() > 0:
                continue  # not due yet: a call carrying the session went out meanwhile
            with self._lock:
                self._last_beat = time.monotonic()
                self.keepalives += 1
            try:
                reply = self.run(self.connection.keep_alive)
                if self.on_keep_alive is not None and reply is not None:
                    self.on_keep_alive(reply)
            except TrainerSuperseded:
                return
            except Exception as error:  # the main loop sees the same problem on its next call
                if not self._closed.is_set():
                    logger.warning("keep-alive failed: %s", error)


class TaskLedger:
    """The tasks a client holds and the acknowledgements it owes the master. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, pb.Task] = {}  # being read or prefetched
        self._settled: deque[tuple[int, int]] = deque(maxlen=64)  # (task, attempt) let go of
        self._acks: list[pb.TaskRef] = []

    @property
    def holding(self) -> bool:
        """True while a task is held (being read, or prefetched)."""
        with self._lock:
            return bool(self._held)

    @property
    def owes_acks(self) -> bool:
        """True while an acknowledgement waits to be delivered."""
        with self._lock:
            return bool(self._acks)

    def held(self) -> list[pb.Task]:
        with self._lock:
            return list(self._held.values())

    def seen(self, task: pb.Task) -> bool:
        """Held, or let go of lately: a task the master re-sent, with nothing new to read."""
        with self._lock:
            return task.id in self._held or (task.id, task.attempt) in self._settled

    def hold(self, task: pb.Task) -> None:
        with self._lock:
            self._held.setdefault(task.id, task)

    def let_go(self, task: pb.Task) -> bool:
        """Stops holding `task`; False when it was not held (e.g. forgotten by a registration)."""
        with self._lock:
            self._settled.append((task.id, task.attempt))
            return self._held.pop(task.id, None) is not None

    def acknowledge(self, task: pb.Task) -> None:
        """Lets go of `task` and owes the master its acknowledgement."""
        with self._lock:
            self._settled.append((task.id, task.attempt))
            self._held.pop(task.id, None)
            self._acks.append(pb.TaskRef(task_id=task.id, epoch=task.epoch, attempt=task.attempt))

    def take_acks(self) -> list[pb.TaskRef]:
        """The acknowledgements owed, now in the caller's hands (see `restore_acks`)."""
        with self._lock:
            acks, self._acks = self._acks, []
            return acks

    def restore_acks(self, acks: list[pb.TaskRef]) -> None:
        """Owes `acks` again, first: a call that carried them failed."""
        with self._lock:
            self._acks[:0] = acks

    def forget_held(self) -> None:
        """A new session: whatever the old one held went back to the master."""
        with self._lock:
            self._held.clear()


_COUNTED = ("accepted", "stale", "failed", "returned")


@dataclass(frozen=True)
class Progress:
    """Where the job is, as a client last heard: a snapshot, replaced whole, never changed."""

    current_epoch: int = 0
    num_epochs: int = 0
    job_done: bool = False

    @property
    def finished(self) -> bool:
        """The job is done, or its last epoch is behind it."""
        return self.job_done or bool(self.num_epochs and self.current_epoch >= self.num_epochs)


class TaskClient:
    """A trainer's client of the master: `epochs()` of records, read from the tasks it gets.

    Its parts, each the owner of its state: `connection` (MasterConnection), `session`
    (Session), `tasks` (TaskLedger) and `progress` (a Progress snapshot).
    """

    def __init__(self, *, trainer_id: str, locator: MasterLocator,
                 parse: Callable[[Any], Any] | None = None, deadline: float = 300.0,
                 prefetch: bool = True, max_tasks: int = 1) -> None:
        if not trainer_id:
            raise ValueError("trainer_id is empty: set PADDLE_TRAINER_ID or pass trainer_id")
        if max_tasks < 1:
            raise ValueError(f"max_tasks {max_tasks} must be at least 1")
        self.max_tasks = max_tasks  # tasks one GetTask may bring (the master's cap bounds them)
        self.trainer_id = trainer_id
        self.parse = parse
        self.prefetch = prefetch
        self.connection = MasterConnection(locator, deadline=deadline)
        self.tasks = TaskLedger()
        self.session = Session(self.connection, trainer_id=trainer_id, on_register=self._registered)
        # work stealing: the master's split requests ride on KeepAlive answers
        self.steals = Steals(held=self.tasks.held, split=lambda ref, position: self.session.run(
            lambda s: self.connection.split_task(s, ref, position)))
        self.session.on_keep_alive = lambda reply: self.steals.answer(list(reply.split_requests))
        termination.install()  # here, in the main thread, before any thread registers
        self._lock = threading.Lock()  # for writers of `progress` and the counters
        self.progress = Progress()
        self._counts: Counter[str] = Counter()
        self._closed = False  # main thread only
        self._fetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="task-prefetch")
        # Sees every GetTask reply first, in the prefetch thread, and may replace it (e.g.
        # a loader worker that leaves its epoch to a sibling: trainer_agent.paddle).
        self.reply_filter: Callable[[pb.GetTaskResponse], pb.GetTaskResponse] | None = None

    @classmethod
    def from_env(cls, *, trainer_id: str | None = None, parse: Callable[[Any], Any] | None = None,
                 deadline: float | None = None, prefetch: bool = True) -> TaskClient:
        """Reads docs/design.md section 8's variables: PADDLE_TRAINER_ID, PADDLE_MASTER_ENDPOINT,
        PADDLE_ETCD_ENDPOINTS, PADDLE_JOB_NAME, PADDLE_NAMESPACE (and PADDLECLOUD_MASTER_DEADLINE)."""
        if deadline is None:
            raw = os.environ.get("PADDLECLOUD_MASTER_DEADLINE", "300")
            try:
                deadline = float(raw)
            except ValueError:
                raise ValueError(f"PADDLECLOUD_MASTER_DEADLINE={raw[:40]!r} is not a number of seconds") from None
        return cls(trainer_id=trainer_id or default_trainer_id(), locator=MasterLocator.from_env(),
                   parse=parse, deadline=deadline, prefetch=prefetch)

    # ---- the session and where the job is ------------------------------------------------

    @property
    def stats(self) -> dict[str, int]:
        """Tasks accepted, stale, failed and returned, and sessions registered again."""
        with self._lock:
            counts = {name: self._counts[name] for name in _COUNTED}
        return {**counts, "reregistered": self.session.reregistrations}

    def register(self) -> None:
        """Registers a new session now."""
        self.session.register()

    def _registered(self, reply: pb.RegisterTrainerResponse) -> None:
        self.tasks.forget_held()
        with self._lock:
            self.progress = replace(self.progress, current_epoch=reply.current_epoch,
                                    num_epochs=reply.num_epochs)

    def advance(self, reply: pb.GetTaskResponse) -> None:
        """Takes in where the job is from an EPOCH_DONE or JOB_DONE reply."""
        with self._lock:
            if reply.outcome == pb.JOB_DONE:
                epoch = max(self.progress.current_epoch, reply.current_epoch)
                self.progress = replace(self.progress, current_epoch=epoch, job_done=True)
            elif reply.outcome == pb.EPOCH_DONE:
                self.progress = replace(self.progress, current_epoch=reply.current_epoch)

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def _count_results(self, results: Any) -> None:
        for result in results:
            self._count("accepted" if result == pb.ACCEPTED else "stale")

    # ---- tasks ------------------------------------------------------------------

    def fetch(self, epoch: int) -> Future[pb.GetTaskResponse]:
        """The next `GetTask` of `epoch`, in the prefetch thread; the owed acks ride on it."""
        return self._fetcher.submit(self._get_task, epoch)

    def _get_task(self, epoch: int) -> pb.GetTaskResponse:
        acks = self.tasks.take_acks()
        try:
            reply = self.session.run(lambda s: self.connection.get_task(s, epoch=epoch, finished=acks,
                                                                        max_tasks=self.max_tasks))
        except BaseException:
            self.tasks.restore_acks(acks)  # not known to be delivered: send them again
            raise
        self._count_results(reply.finished_results)
        self.session.beat_every(seconds(reply.split_poll))  # work stealing's tail, or back to usual
        if self.reply_filter is not None:
            reply = self.reply_filter(reply)
        return reply

    def fail(self, task: pb.Task, reason: str) -> None:
        """Reports `task` failed for a fault of the data (`TaskFailed`: counts a failure)."""
        self.tasks.let_go(task)
        logger.warning("task %d failed: %s", task.id, reason)
        self._count("failed")
        self.session.run(lambda s: self.connection.task_failed(s, task, reason=reason))

    def give_back(self, task: pb.Task) -> None:
        """Returns a held task untouched (`ReturnTask`: no failure counted)."""
        if not self.tasks.let_go(task):
            return
        self._count("returned")
        try:
            self.session.run(lambda s: self.connection.return_task(s, task, timeout=5))
        except Exception as error:  # the lease returns it anyway when this process is gone
            logger.warning("could not return task %d: %s", task.id, error)

    def flush(self) -> None:
        """Reports every acknowledged task not yet delivered, with TaskFinished."""
        for ref in self.tasks.take_acks():
            result = self.session.run(functools.partial(self.connection.task_finished, ref=ref))
            self._count_results([result])

    def epochs(self) -> Iterator[Epoch]:
        """One `Epoch` per epoch of the job, from the master's current one, until JOB_DONE."""
        self.session.ensure()
        while not self.progress.finished:
            epoch = Epoch(self, self.progress.current_epoch)
            yield epoch
            if not epoch.ended:
                return  # the caller stopped reading mid-epoch
            self.flush()

    def request_save_model(self, *, block: float = 60.0) -> bool:
        """True when this trainer is the one to save the model now (one at a time, for `block`)."""
        return self.session.run(lambda s: self.connection.request_save_model(s, block=block))

    def close(self) -> None:
        """Flushes acknowledgements, gives held tasks back, and leaves (tasks return at once)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.session.active:
                for task in self.tasks.held():
                    self.give_back(task)
                self.flush()
                self.session.leave()
        except Exception as error:
            logger.warning("leaving the master failed: %s (the session lease will lapse)", error)
        finally:
            self.session.close()
            self._fetcher.shutdown(wait=False, cancel_futures=True)
            self.connection.close()

    def __enter__(self) -> TaskClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Epoch:
    """One epoch's worth of records, as this trainer gets them."""

    def __init__(self, client: TaskClient, number: int, *,
                 stop: Callable[[], bool] | None = None,
                 consumed: frozenset[int] = frozenset()) -> None:
        self.client = client
        self.number = number
        self.ended = False
        self.tasks_read = 0
        self.finished: list[int] = []  # ids of the tasks read to their end, acknowledged
        self.current_task: pb.Task | None = None  # the task whose records are being read
        # Asked after each task read to its end: True ends `records()` there, between
        # tasks (`ended` stays False), giving back the tasks held but not yet read. A
        # process draining to a checkpoint (`termination.stop_requested()`) ends there
        # too, and also while it waits.
        self.stop = stop
        # Tasks of this epoch a checkpoint's model already consumed: acknowledged unread.
        self.consumed = consumed

    def __repr__(self) -> str:
        return f"Epoch({self.number})"

    def records(self) -> Iterator[Any]:
        client, tasks = self.client, self.client.tasks
        if termination.stop_requested():
            return  # draining to a checkpoint (SIGTERM): no new task
        pending: Future[pb.GetTaskResponse] | None = client.fetch(self.number)
        unread: deque[pb.Task] = deque()  # held, not yet read: the current task first
        try:
            while pending is not None:
                reply = pending.result()
                pending = None
                outcome = reply.outcome
                if outcome == pb.TASK:
                    batch = [t for t in (reply.task, *reply.more_tasks) if not tasks.seen(t)]
                    if not batch:  # re-sent: nothing new for us yet
                        time.sleep(0.05)
                        pending = client.fetch(self.number)
                        continue
                    for task in batch:
                        tasks.hold(task)
                    unread.extend(batch)
                    while unread:
                        if client.prefetch and len(unread) == 1:  # the last of the batch: fetch on
                            pending = client.fetch(self.number)
                        yield from self._read(unread[0])
                        unread.popleft()
                        if (self.stop is not None and self.stop()) or termination.stop_requested():
                            raise _Stopped
                    if pending is None:
                        pending = client.fetch(self.number)
                elif outcome == pb.WAIT:
                    if termination.stop_requested():
                        raise _Stopped  # draining: wait for nothing more
                    if not tasks.owes_acks:  # news to deliver goes at once; otherwise back off
                        time.sleep(seconds(reply.retry_after) * random.uniform(0.5, 1.5))
                    pending = client.fetch(self.number)
                elif outcome in (pb.EPOCH_DONE, pb.JOB_DONE):
                    client.advance(reply)
                elif outcome == pb.ALL_TASKS_FAILED:
                    raise AllTasksFailed(f"every task of epoch {reply.current_epoch} failed: the job failed")
            self.ended = True
        except BaseException as error:
            # stop(), break, an exception in the caller's loop, Ctrl-C: give back what we hold.
            for task in unread:
                client.give_back(task)
            if pending is not None:
                try:
                    reply = pending.result(timeout=CALL_TIMEOUT)
                    if reply.outcome == pb.TASK:
                        for task in (reply.task, *reply.more_tasks):
                            # A task re-sent (the master re-sends a held task when nothing is
                            # left to deal) that was read and acknowledged must not go back:
                            # its ack would be stale and another trainer would read it again.
                            if tasks.seen(task):
                                continue
                            tasks.hold(task)
                            client.give_back(task)
                except Exception:
                    pass
            if not isinstance(error, _Stopped):
                raise

    def _read(self, task: pb.Task) -> Iterator[Any]:
        parse = self.client.parse
        self.current_task = task
        if task.id in self.consumed:
            logger.info("task %d of epoch %d: consumed before the restart, not read again",
                        task.id, self.number)
            self.finished.append(task.id)
            self.client.tasks.acknowledge(task)
            return
        cursor = self.client.steals.cursor(task)  # stops where a split was agreed
        try:
            for raw in cursor.read(task.format or "lines"):
                record = parse(raw) if parse is not None else raw
                yield record
        except (DataError, ValueError, KeyError, TypeError, UnicodeError) as error:
            # The data is at fault (a reader or parse error): count a failure for the task.
            self.client.fail(task, f"{type(error).__name__}: {error}")
            return
        finally:
            self.client.steals.done(task)
        if cursor.give_back:  # a split's outcome is unknown: the master must not count it done
            self.client.give_back(task)
            return
        self.tasks_read += 1
        self.finished.append(task.id)
        self.client.tasks.acknowledge(task)


class _Stopped(Exception):
    """`Epoch.stop` said stop: ends `records()` between tasks, through its give-back path."""
