"""Calls to a job's leading master, asyncio end to end: the one client of the master API.

Every caller of a master goes through `MasterConnection`: the trainer's library (through
the synchronous facade in `trainer_agent.client`), the CLI (`job status`, `job scale`,
`job evict`), the local backend, the autoscaler and the scale benchmark's simulated
trainers. So the retries, the leader following and the credentials are written once and
the benchmark measures the client users run.

What it does: each call retries UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED (a
saturated master sheds load and says how long to wait: `google.rpc.RetryInfo`) and
CANCELLED (unless this connection was closed) with jittered backoff until `deadline`
seconds have passed, then raises `MasterUnavailable`. Between attempts it follows a
standby's NOT_LEADER hint (the `leader` of its ErrorInfo, `paddlecloud.wire`), else
resolves the leader again (`MasterLocator`: a fixed endpoint, or etcd), avoiding a master
that did not answer at all while etcd still names it. GetTask goes over one
`GetTaskStream` per session (a message on a stream costs the master a fraction of a unary
call), unary at a master that answers the stream UNIMPLEMENTED.

What it does NOT do: keep a session (`paddlecloud.master_client.session`), or act on a
session's reasons (SESSION_EXPIRED, SESSION_SUPERSEDED): the session does. It is not
thread-safe: every call runs on the event loop that made the connection.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from asyncio import sleep  # module-level: a test records the waits
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from paddlecloud.api import pb, pb_grpc
from paddlecloud.auth import ClientCredentials
from paddlecloud.master_client.discovery import DiscoveryError, MasterLocator
from paddlecloud.wire import Reason, duration, error_info

logger = logging.getLogger(__name__)

# gRPC core's fork support, on by default, crashes a child forked while grpc.aio's poller
# runs (a Paddle DataLoader's workers: SIGSEGV in the child). It is read when gRPC first
# starts a channel, after this import; a process that set the variable keeps its choice.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# How long one attempt of a call may take. Long: a call waits its turn in a busy master's
# queue (about N / throughput), and one cut off there goes to the back of it again. A master
# gone without closing the connection (its node lost, its process stopped) is noticed
# sooner, by keep-alive pings that go unanswered (`paddlecloud.wire.CLIENT_KEEPALIVE`).
CALL_TIMEOUT = 60.0
LAST_ATTEMPT = 1.0  # the least time one attempt is given, however little of `deadline` is left
# The longest wait between two attempts of a call (full-jitter exponential backoff from 50 ms):
# a new leader is noticed within about this long of serving, while a standby, cheap to answer,
# takes at most ~1 call per client per second until then.
RETRY_CAP = 1.0
# Codes a call is retried on: the master is away (UNAVAILABLE), slow (DEADLINE_EXCEEDED),
# shedding load on purpose (RESOURCE_EXHAUSTED), or the call was cancelled on the way
# (CANCELLED: gRPC's own queues, a connection reset) while this client did not cancel it.
TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                       grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED})

T = TypeVar("T")
Invoke = Callable[[pb_grpc.MasterStub, float], Awaitable[T]]


class LocalStatus(grpc.RpcError):
    """A failed call as this client tells it, the master having said nothing: a code and a
    message, no ErrorInfo or RetryInfo. Handled as any failed call (a grpc.RpcError)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> None:
        return None


class MasterUnavailable(LocalStatus):
    """The master did not answer within the deadline; the message names where it looked, the
    code is the last attempt's (UNAVAILABLE, DEADLINE_EXCEEDED, ...)."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        super().__init__(code, message)


class ConnectionClosed(RuntimeError):
    """A call on a `MasterConnection` after its `close()`."""


def retry_delay(error: BaseException | None) -> float:
    """The delay a shedding master asks for (`google.rpc.RetryInfo`), jittered; 0 if none."""
    if not isinstance(error, grpc.RpcError) or error.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
        return 0.0
    try:
        status = rpc_status.from_call(error)  # type: ignore[arg-type]
    except (ValueError, AttributeError):
        return 0.0
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return info.retry_delay.ToNanoseconds() / 1e9 * random.uniform(0.5, 1.5)
    return 0.0


def reason_of(error: BaseException) -> tuple[Reason | None, dict[str, str]]:
    """The ErrorInfo reason and metadata a failed call carries; (None, {}) when none."""
    found = error_info(error) if isinstance(error, grpc.RpcError) else None
    return found if found is not None else (None, {})


class TaskStream:
    """One `GetTaskStream` of one session at one master: `ask` sends a GetTask and waits for
    its answer, at most `wait` seconds; one request at a time, so each answer is the one for
    its request. A stream that
    failed is done: `ask` raises the master's status (or DEADLINE_EXCEEDED when no answer
    came in time), and the connection opens another."""

    def __init__(self, stub: pb_grpc.MasterStub, session: int, metadata: tuple[tuple[str, str], ...]) -> None:
        self.stub, self.session = stub, session
        self._call = stub.GetTaskStream(metadata=metadata)
        self._asking = asyncio.Lock()
        self._ended: BaseException | None = None
        self._answered = False

    def refused(self, error: grpc.RpcError) -> bool:
        """`error` may be the master's refusal of streams: UNIMPLEMENTED, or grpc.aio's INTERNAL
        for a stream that failed before its first answer."""
        return error.code() is grpc.StatusCode.UNIMPLEMENTED or (
            not self._answered and error.code() is grpc.StatusCode.INTERNAL)

    async def ask(self, request: pb.GetTaskRequest, wait: float) -> pb.GetTaskResponse:
        async with self._asking:
            if self._ended is not None:
                raise self._ended
            try:
                async with asyncio.timeout(wait):  # no task of its own, unlike wait_for
                    await self._write(request)
                    reply = await self._call.read()
            except (TimeoutError, asyncio.InvalidStateError):
                raise self._end(LocalStatus(grpc.StatusCode.DEADLINE_EXCEEDED,
                                            f"no answer on the task stream in {wait:g}s")) from None
            except grpc.RpcError as error:
                raise self._end(error) from None
            if reply is grpc.aio.EOF:
                raise self._end(LocalStatus(grpc.StatusCode.UNAVAILABLE, "the master ended the task stream"))
            self._answered = True
            return reply

    async def _write(self, request: pb.GetTaskRequest) -> None:
        """Sends `request`. grpc.aio reports a write to a stream that already ended as INTERNAL,
        its status lost: after an answer, that is a stream cut (retried on a new one); before
        any, possibly the master's refusal of streams (`refused`)."""
        try:
            await self._call.write(request)
        except grpc.aio.AioRpcError as error:
            if self._answered and error.code() is grpc.StatusCode.INTERNAL:
                raise LocalStatus(grpc.StatusCode.CANCELLED, f"the task stream ended: {error.details()}") from None
            raise

    def _end(self, error: grpc.RpcError) -> grpc.RpcError:
        """`error` ends this stream: every later `ask` raises it."""
        self._ended = error
        self.close()
        return error

    def close(self) -> None:
        self._call.cancel()


class MasterConnection:
    """Calls to the job's leading master: one typed coroutine per RPC (see the module docstring).

    `credentials` (default: `ClientCredentials.from_env()`) open the channels (TLS with the
    master's CA) and authenticate the calls: the job's token, and for a session the session
    token its registration returned. `open_channel(address)` makes a grpc.aio channel
    (default: the credentials'). One channel per address, kept until `close()`: a call may
    still be under way on the old one when another moves to a new leader. `observe(error)`,
    if given, hears every failed attempt that is retried (the scale benchmark counts them).
    """

    def __init__(self, locator: MasterLocator, *, deadline: float,
                 credentials: ClientCredentials | None = None,
                 open_channel: Callable[[str], grpc.aio.Channel] | None = None,
                 observe: Callable[[BaseException], None] | None = None) -> None:
        self.locator = locator
        self.deadline = deadline
        self.credentials = credentials if credentials is not None else ClientCredentials.from_env()
        self._open_channel = open_channel or self.credentials.aio_channel
        self._observe = observe
        self._session_tokens: dict[int, str] = {}  # session id -> its token (RegisterTrainer's reply)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._address: str | None = None
        self._unanswered: str | None = None  # a master that did not answer the last attempt at it
        self._stub: pb_grpc.MasterStub | None = None
        self._resolving = asyncio.Lock()  # one look-up of the leader at a time
        self._closed = False
        # GetTask goes over one stream of the current session at the current master; unary
        # once a master answered UNIMPLEMENTED (one from before GetTaskStream, --no-task-streams).
        self._stream: TaskStream | None = None
        self._streaming = True

    @property
    def address(self) -> str | None:
        """The master's address the next call goes to (None before the first)."""
        return self._address

    def _as(self, session: int | None = None) -> tuple[tuple[str, str], ...]:
        """The call's metadata: the session's token, else the job's token."""
        return self.credentials.metadata(self._session_tokens.get(session) if session else None)

    # ---- the session's RPCs -----------------------------------------------------------

    async def register_trainer(self, trainer_id: str) -> pb.RegisterTrainerResponse:
        request = pb.RegisterTrainerRequest(trainer_id=trainer_id)
        reply = await self._call(lambda stub, wait: stub.RegisterTrainer(request, timeout=wait,
                                                                         metadata=self._as()))
        if reply.session_token:
            self._session_tokens[reply.session_id] = reply.session_token
        return reply

    async def keep_alive(self, session: int) -> pb.KeepAliveResponse:
        request = pb.KeepAliveRequest(session_id=session)
        return await self._call(lambda stub, wait: stub.KeepAlive(request, timeout=wait,
                                                                   metadata=self._as(session)))

    async def split_task(self, session: int, ref: pb.TaskRef, position: int) -> int:
        """SplitTask (work stealing: trainer_agent.stealing): the master's SplitAnswer."""
        request = pb.SplitTaskRequest(session_id=session, task_id=ref.task_id, epoch=ref.epoch,
                                      attempt=ref.attempt, position=position)
        reply = await self._call(lambda stub, wait: stub.SplitTask(request, timeout=wait,
                                                                    metadata=self._as(session)))
        return reply.answer

    async def leave_trainer(self, session: int, *, timeout: float) -> None:
        request = pb.LeaveTrainerRequest(session_id=session)
        await self._call(lambda stub, wait: stub.LeaveTrainer(request, timeout=min(timeout, wait),
                                                              metadata=self._as(session)))

    async def get_task(self, session: int, *, epoch: int, finished: list[pb.TaskRef],
                       max_tasks: int = 1) -> pb.GetTaskResponse:
        """The next task of `epoch` (up to `max_tasks`: `task` and `more_tasks`), or why there
        is none; `finished` acknowledges tasks read."""
        request = pb.GetTaskRequest(session_id=session, epoch=epoch, finished=finished, max_tasks=max_tasks)
        return await self._call(lambda stub, wait: self._get_task(stub, session, request, wait))

    async def _get_task(self, stub: pb_grpc.MasterStub, session: int, request: pb.GetTaskRequest,
                        wait: float) -> pb.GetTaskResponse:
        """One GetTask over the session's task stream, else (a master without one) unary."""
        stream = self._task_stream(stub, session)
        if stream is None:
            return await stub.GetTask(request, timeout=wait, metadata=self._as(session))
        try:
            return await stream.ask(request, wait)
        except grpc.RpcError as error:
            if self._stream is stream:
                self._stream = None
            if not stream.refused(error):
                raise
        # Answered unary, this master serves no streams: grpc.aio reports a refusal that raced
        # the stream's first request as INTERNAL, not as UNIMPLEMENTED, so the unary call decides.
        reply = await stub.GetTask(request, timeout=wait, metadata=self._as(session))
        self._streaming = False
        logger.info("the master at %s has no GetTaskStream: GetTask goes unary", self.address)
        return reply

    def _task_stream(self, stub: pb_grpc.MasterStub, session: int) -> TaskStream | None:
        """The open stream of `session` at `stub`'s master; a new one when the master or the
        session changed (the old one is closed); None once streams are not served."""
        if not self._streaming or self._closed:
            return None
        current = self._stream
        if current is not None and current.stub is stub and current.session == session:
            return current
        if current is not None:
            current.close()
        self._stream = TaskStream(stub, session, self._as(session))
        return self._stream

    async def task_finished(self, session: int, ref: pb.TaskRef) -> pb.ReportResult:
        request = pb.TaskReport(session_id=session, task_id=ref.task_id, epoch=ref.epoch, attempt=ref.attempt)
        reply = await self._call(lambda stub, wait: stub.TaskFinished(request, timeout=wait,
                                                                      metadata=self._as(session)))
        return reply.result

    async def task_failed(self, session: int, task: pb.Task, *, reason: str) -> None:
        request = _report(session, task, reason)
        await self._call(lambda stub, wait: stub.TaskFailed(request, timeout=wait, metadata=self._as(session)))

    async def return_task(self, session: int, task: pb.Task, *, timeout: float) -> None:
        request = _report(session, task)
        await self._call(lambda stub, wait: stub.ReturnTask(request, timeout=min(timeout, wait),
                                                            metadata=self._as(session)))

    async def request_save_model(self, session: int, *, block: float) -> bool:
        """True when this session's trainer is granted the save for `block` seconds."""
        request = pb.RequestSaveModelRequest(session_id=session, block=duration(block))
        reply = await self._call(lambda stub, wait: stub.RequestSaveModel(request, timeout=wait,
                                                                          metadata=self._as(session)))
        return reply.granted

    # ---- the job's RPCs (the CLI, the local backend, the autoscaler) ------------------------

    async def get_status(self) -> pb.GetStatusResponse:
        return await self._call(lambda stub, wait: stub.GetStatus(pb.GetStatusRequest(), timeout=wait,
                                                                  metadata=self._as()))

    async def list_tasks(self, *, state: pb.TaskState, epoch: int, page_size: int = 1000) -> list[pb.TaskInfo]:
        """Every task of `epoch` in `state` (ListTasks, page after page; any token of the job)."""
        tasks: list[pb.TaskInfo] = []
        token = ""
        while True:
            request = pb.ListTasksRequest(state=state, epoch=epoch, page_size=page_size, page_token=token)
            reply = await self._call(lambda stub, wait, request=request: stub.ListTasks(
                request, timeout=wait, metadata=self._as()))
            tasks.extend(reply.tasks)
            token = reply.next_page_token
            if not token:
                return tasks

    async def scale_trainers(self, trainers: int) -> pb.ScaleTrainersResponse:
        request = pb.ScaleTrainersRequest(trainers=trainers)
        return await self._call(lambda stub, wait: stub.ScaleTrainers(request, timeout=wait, metadata=self._as()))

    async def evict_trainer(self, trainer_id: str) -> pb.EvictTrainerResponse:
        request = pb.EvictTrainerRequest(trainer_id=trainer_id)
        return await self._call(lambda stub, wait: stub.EvictTrainer(request, timeout=wait, metadata=self._as()))

    async def restart_epoch(self, epoch: int, *, done_tasks: list[int], reopen: bool) -> pb.RestartEpochResponse:
        request = pb.RestartEpochRequest(epoch=epoch, done_tasks=done_tasks, reopen=reopen)
        return await self._call(lambda stub, wait: stub.RestartEpoch(request, timeout=wait, metadata=self._as()))

    # ---- retries and the leader -----------------------------------------------------

    def _transient(self, error: BaseException) -> bool:
        """Worth another attempt: see the module docstring. A call cancelled because this
        connection closed is not (the client caused it)."""
        if isinstance(error, DiscoveryError):
            return True
        if not isinstance(error, grpc.RpcError) or error.code() not in TRANSIENT:
            return False
        return error.code() is not grpc.StatusCode.CANCELLED or not self._closed

    async def _call(self, invoke: Invoke[T]) -> T:
        """`invoke(stub, seconds)`, retried while the master is away or busy until `deadline`;
        one attempt waits at most CALL_TIMEOUT seconds, and never past that deadline. (A loop
        of its own rather than tenacity's AsyncRetrying, whose set-up a trainer would pay on
        every GetTask.)"""
        give_up = time.monotonic() + self.deadline
        credit = 0.0  # seconds the attempts took that no wait has counted yet
        failures = 0
        while True:
            sent = time.monotonic()
            used = self._address
            try:
                stub = self._stub
                if stub is None:
                    stub, used = await self._connect()
                reply = await invoke(stub, min(CALL_TIMEOUT, max(LAST_ATTEMPT, give_up - sent)))
            except Exception as error:
                if not self._transient(error):
                    raise
                if time.monotonic() >= give_up:
                    raise _unavailable(error, self.address or self.locator.describe(), self.deadline) from None
                failures += 1
                credit += time.monotonic() - sent
                delay, credit = _backoff(error, failures, credit)
                await self._after_failure(error, used)
                await sleep(delay)
                continue
            self._unanswered = None
            return reply

    async def _connect(self, address: str | None = None) -> tuple[pb_grpc.MasterStub, str]:
        """Makes `address` (default: the leader the locator resolves, avoiding a master that
        did not answer while etcd still names it) the current master."""
        if address is None:
            async with self._resolving:  # the etcd read runs in a thread: the loop goes on
                self._check_open()
                address = self.locator.master_endpoint or await asyncio.to_thread(
                    self.locator.resolve, avoid=self._unanswered)
        self._check_open()
        if address not in self._channels:
            self._channels[address] = self._open_channel(address)
        self._address = address
        self._stub = pb_grpc.MasterStub(self._channels[address])
        return self._stub, address

    def _check_open(self) -> None:
        if self._closed:
            raise ConnectionClosed(f"connection to {self.locator.describe()} is closed")

    async def _after_failure(self, error: BaseException, address: str | None) -> None:
        """Points the next attempt at the leader a standby named, or lets it re-resolve. A
        master at `address` that did not answer at all (UNAVAILABLE with no reason: every
        UNAVAILABLE a master answers itself says why) is avoided while etcd's leader key
        still names it: the next attempt goes to a standby, which holds it until the
        election is decided."""
        if self._observe is not None:
            self._observe(error)
        reason, metadata = reason_of(error)
        leader = metadata.get("leader") if reason is Reason.NOT_LEADER else None
        self._stub = None
        if reason is None and isinstance(error, grpc.RpcError) and error.code() is grpc.StatusCode.UNAVAILABLE:
            self._unanswered = address
        if leader and not self.locator.master_endpoint:
            await self._connect(leader)

    async def close(self) -> None:
        """Closes every channel (calls under way end CANCELLED); later calls raise ConnectionClosed."""
        self._closed = True
        channels = list(self._channels.values())
        self._channels.clear()
        self._stub = None
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        for channel in channels:
            await channel.close()

    async def __aenter__(self) -> MasterConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _unavailable(last: BaseException, where: str, deadline: float) -> MasterUnavailable:
    """What a call that ran out of its deadline at `where` raises, `last` its last failure."""
    if isinstance(last, grpc.RpcError):
        return MasterUnavailable(f"master unreachable at {where} for {deadline:g}s: {last.details()}", last.code())
    return MasterUnavailable(f"master unreachable at {where} for {deadline:g}s: {last}")


def _backoff(error: BaseException, failures: int, credit: float) -> tuple[float, float]:
    """(the wait before the next attempt, the credit left). A shedding master's RetryInfo,
    else full-jitter exponential backoff from 50 ms up to RETRY_CAP, less the time the
    attempts took that no earlier wait counted (gRPC counts its backoff from an attempt's
    start, too): a call a master held (`--failover-hold`) has waited already, and so has the
    quick attempt after it (the leader it named, dead: refused). The credit is spent as it
    is counted, so attempts refused at once, one after another, back off."""
    asked = retry_delay(error)
    if asked:
        return asked, credit
    delay = random.uniform(0, min(RETRY_CAP, 0.05 * 2 ** min(failures - 1, 30)))
    spent = min(credit, delay)
    return delay - spent, credit - spent


def ask_master(address: str, ask: Callable[[MasterConnection], Awaitable[T]], *, timeout: float,
               credentials: ClientCredentials) -> T:
    """`ask(connection)` from synchronous code (the CLI, the autoscaler): a connection of its own
    to the master at `address`, on an event loop of its own, retrying until `timeout`. Raises
    grpc.RpcError: the master's refusal (a code that is not transient), or MasterUnavailable
    when it did not answer in time."""
    async def asking() -> T:
        async with MasterConnection(MasterLocator(master_endpoint=address), deadline=timeout,
                                    credentials=credentials) as connection:
            return await ask(connection)
    return asyncio.run(asking())


def _report(session: int, task: pb.Task, reason: str = "") -> pb.TaskReport:
    return pb.TaskReport(session_id=session, task_id=task.id, epoch=task.epoch,
                         attempt=task.attempt, reason=reason)
