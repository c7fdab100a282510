"""The thin grpc.aio edge of the master: protobuf in, a call into one room, protobuf out.

Domain errors become status codes here and nowhere else; every message names the
bad value. A standby master answers UNAVAILABLE with the leader's address (a trainer's
call after holding it up to `--failover-hold`, in case this master leads meanwhile). Only
the dispatcher's own `InvalidArgument` is INVALID_ARGUMENT; a cache out of step (it is
being rebuilt) is UNAVAILABLE, so the client retries; anything else is a bug: logged
with its traceback and answered INTERNAL. etcd out of space (NOSPACE) is
RESOURCE_EXHAUSTED with what the operator must do; so is a registration whose lease lapsed
before its session was written (`TooSlow`: the master is slower than the session TTL; the
trainer registers again). Who may call what is decided before this module runs
(`master.authorization`); here only which fields the caller sees (session ids and
attempts: the operator only).

Admission: at most `max_in_flight` trainer calls are worked on at once; one more is
answered RESOURCE_EXHAUSTED before it reaches the dispatcher (no job state read or written), with a
`google.rpc.RetryInfo` of SHED_RETRY seconds (one status, built once), and the trainer
retries it after about that long, jittered, its acks still in the request; the shed
call still refreshes its session's lease when due, unwaited (its trainer is alive). That
bounds the latency of the calls admitted (about max_in_flight / throughput) instead
of letting gRPC's queue grow until it cancels calls. Inspection RPCs (GetStatus,
ListTasks, ListTrainers) are never shed, nor are the GetTasks of a stream: those wait
their turn for STREAM_SLOTS slots of their own (`GetTaskStream`). What it does NOT do:
order the retries; a trainer unlucky several times in a row waits up to its backoff's
cap (`RETRY_CAP`, 1 s). Registrations are also bounded per token (`master.rate_limit`):
past the bucket, RESOURCE_EXHAUSTED with ErrorInfo RATE_LIMITED and a RetryInfo, before any
etcd work. A GetTask carries at most 8 x --max-tasks-per-trainer `finished` refs
(`Tasks.check_finished_count`, before a ref is looked at).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable

import grpc

from master import inspection, metrics
from master.authorization import caller
from master.config import DatasetSpec
from master.core import CacheOutOfStep, FailedPrecondition, InvalidArgument, TooSlow
from master.dispatcher import Dispatcher
from master.rate_limit import RateLimited, RegistrationLimit
from master.sessions import SessionExpired, SessionSuperseded, TooManySessions, UnknownTrainer
from master.state import Outcome, TaskStatus
from master.store_errors import NotLeader, StoreFull, StoreUnavailable
from master.tasks import GetTaskResult, TaskRef
from paddlecloud.api import pb, pb_grpc
from paddlecloud.untrusted import loggable
from paddlecloud.wire import Reason, duration, error_status, seconds

logger = logging.getLogger(__name__)

MAX_REASON = 4096  # characters of a TaskFailed reason kept (it is only logged)
HOLD_MARGIN = 0.5  # a held call is answered this long before its deadline at the latest

_ERRORS: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (SessionExpired, grpc.StatusCode.NOT_FOUND),
    (UnknownTrainer, grpc.StatusCode.NOT_FOUND),
    (SessionSuperseded, grpc.StatusCode.FAILED_PRECONDITION),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (NotLeader, grpc.StatusCode.UNAVAILABLE),
    (StoreFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE),
    (CacheOutOfStep, grpc.StatusCode.UNAVAILABLE),
    (TooSlow, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (RateLimited, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (TooManySessions, grpc.StatusCode.RESOURCE_EXHAUSTED),
]


def _details(error: BaseException) -> tuple[Reason, dict[str, str]] | None:
    """The machine-readable reason of the errors a client acts on (paddlecloud.wire)."""
    if isinstance(error, NotLeader):
        return Reason.NOT_LEADER, ({"leader": error.leader} if error.leader else {})
    if isinstance(error, SessionExpired):
        return Reason.SESSION_EXPIRED, {}
    if isinstance(error, SessionSuperseded):
        return Reason.SESSION_SUPERSEDED, {"trainer": error.trainer}
    if isinstance(error, (StoreUnavailable, CacheOutOfStep)):
        # said, so that a client tells it from a master that did not answer at all
        return Reason.TRANSIENT, {}
    return None


# GetTasks of streams worked on at once; the others wait their turn, FIFO. Few: the calls
# worked on are what makes one turn of the event loop long, and gRPC accepts one new call
# (a new stream, a KeepAlive, a registration) per turn: fewer slots served thousands of
# streaming trainers faster (docs/benchmarks.md, "Scale").
STREAM_SLOTS = 64

SHED_RETRY = 1.0  # seconds a shed call is told to wait (the client jitters it x U(0.5, 1.5))


def _shed_status(limit: int) -> grpc.Status:
    return error_status(grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"master saturated: {limit} calls in flight (--max-calls-in-flight {limit}); "
                        f"retry in about {SHED_RETRY:g}s", None, retry_after=SHED_RETRY)


def _rpc(method: Callable, *, name: str | None = None) -> Callable:
    """Times the call, finds the dispatcher (or answers where the leader is), maps errors."""
    return _wrap(method, shed=True, name=name)


def _inspection(method: Callable) -> Callable:
    """As `_rpc`, never shed: an operator's look at a saturated master must get through."""
    return _wrap(method, shed=False)


def _wrap(method: Callable, *, shed: bool, name: str | None = None, hold: bool = True) -> Callable:
    name = name or method.__name__
    histogram = metrics.RPC_LATENCY.labels(name)

    @functools.wraps(method)
    async def wrapper(self: MasterServicer, request, context: grpc.aio.ServicerContext):
        if hold and self.dispatcher() is None:  # before admission: a held call is no work
            await self._hold(request, context)
        if shed:
            if self.in_flight >= self.max_in_flight:
                metrics.SHED_CALLS.labels(name).inc()
                await self._keep_session(request)
                await context.abort_with_status(self.shed_status)
            self.in_flight += 1
        started = time.perf_counter()
        try:
            dispatcher = self.dispatcher()
            if dispatcher is None:
                raise NotLeader(self.leader_hint())
            return await method(self, dispatcher, request)
        except tuple(e for e, _ in _ERRORS) as error:
            code = next(c for e, c in _ERRORS if isinstance(error, e))
            if isinstance(error, RateLimited):
                metrics.RATE_LIMITED.labels(name).inc()
                await context.abort_with_status(error_status(code, str(error), Reason.RATE_LIMITED,
                                                             retry_after=error.retry_after))
            details = _details(error)
            if details is None:
                await context.abort(code, str(error))
            await context.abort_with_status(error_status(code, str(error), *details))
        except Exception as error:
            logger.exception("%s failed", name)
            await context.abort(grpc.StatusCode.INTERNAL,
                                f"{name} failed: {type(error).__name__}: {loggable(str(error))}")
        finally:
            if shed:
                self.in_flight -= 1
            histogram.observe(time.perf_counter() - started)

    return wrapper


# Outcome -> wire enum value (`pb.Outcome.Value(name)` costs a lookup by name per call).
_OUTCOMES = {o: pb.Outcome.Value(o.value) for o in Outcome}


def _result(accepted: bool) -> int:
    return pb.ACCEPTED if accepted else pb.STALE


def _task_status(value: int) -> TaskStatus:
    """A wire TaskState as the state machine's status; an unknown value is the caller's fault."""
    try:
        return TaskStatus[pb.TaskState.Name(value)]
    except (ValueError, KeyError):
        raise InvalidArgument(f"state {value} is not a TaskState: use one of TODO, PENDING, DONE, FAILED") from None


def _ref(report: pb.TaskReport | pb.TaskRef) -> TaskRef:
    task_id = report.task_id
    return TaskRef(task_id, report.epoch, report.attempt)


class MasterServicer(pb_grpc.MasterServicer):
    def __init__(self, *, dispatcher: Callable[[], Dispatcher | None],
                 leader_hint: Callable[[], str | None], max_in_flight: int = 1024,
                 session_token: Callable[[int], str] | None = None, task_streams: bool = True,
                 serving_dispatcher: Callable[[float], Awaitable[Dispatcher | None]] | None = None,
                 hold: float = 0.0, registrations: RegistrationLimit | None = None) -> None:
        self.dispatcher = dispatcher
        self.serving_dispatcher = serving_dispatcher  # waits up to N seconds for `dispatcher()`
        self.hold = hold if serving_dispatcher is not None else 0.0  # --failover-hold
        self.task_streams = task_streams  # off (--no-task-streams): GetTaskStream is UNIMPLEMENTED
        self.leader_hint = leader_hint
        self.session_token = session_token  # None: a master without tokens
        self.max_in_flight = max_in_flight
        self.shed_status = _shed_status(max_in_flight)
        self.in_flight = 0  # shed calls being worked on (one event loop: no lock)
        self.stream_slots = asyncio.Semaphore(STREAM_SLOTS)  # streams' GetTasks worked on at once
        self.registrations = registrations  # None: registrations unbounded

    async def _hold(self, request, context: grpc.aio.ServicerContext) -> None:
        """A trainer's call (it has a session) at a master that does not serve waits up to
        `hold` seconds for it to serve: through a failover, the trainers that reached the next
        leader are answered the moment it serves instead of one backoff later. Never past the
        call's deadline (HOLD_MARGIN before it); a call without a session (a registration,
        a look at the job) is answered at once."""
        if not self.hold or not getattr(request, "session_id", 0):
            return
        left = context.time_remaining()
        seconds = self.hold if left is None else min(self.hold, left - HOLD_MARGIN)
        if seconds > 0 and self.serving_dispatcher is not None:
            served = await self.serving_dispatcher(seconds) is not None
            metrics.HELD_CALLS.labels("served" if served else "not_leader").inc()

    async def _keep_session(self, request) -> None:
        """A shed call's session outlives the wait it is told to take (`Trainers.keep`)."""
        session = getattr(request, "session_id", 0)
        dispatcher = self.dispatcher()
        if session and dispatcher is not None:
            await dispatcher.trainers.keep(session)

    @_rpc
    async def RegisterTrainer(self, d: Dispatcher, request):
        if self.registrations is not None:  # before any etcd work (master.rate_limit)
            self.registrations.admit(caller().role.value)
        r = await d.trainers.register(request.trainer_id)
        token = self.session_token(r.session) if self.session_token is not None else ""
        return pb.RegisterTrainerResponse(session_id=r.session, ttl=duration(r.ttl), session_token=token,
                                          current_epoch=r.current_epoch, num_epochs=r.num_epochs)

    @_rpc
    async def KeepAlive(self, d: Dispatcher, request):
        ttl = await d.trainers.keep_alive(request.session_id)
        asked = [pb.TaskRef(task_id=r.task, epoch=r.epoch, attempt=r.attempt)
                 for r in d.stealing.requests_for(request.session_id)]
        return pb.KeepAliveResponse(ttl=duration(ttl), split_requests=asked)

    @_rpc
    async def SplitTask(self, d: Dispatcher, request):
        answer = await d.stealing.split(request.session_id, request.task_id, request.epoch, request.attempt,
                                        request.position)
        return pb.SplitTaskResponse(answer=pb.SplitAnswer.Value(answer))

    @_rpc
    async def LeaveTrainer(self, d: Dispatcher, request):
        await d.trainers.leave(request.session_id)
        return pb.LeaveTrainerResponse()

    async def _get_task(self, d: Dispatcher, request):
        d.tasks.check_finished_count(len(request.finished))  # before a TaskRef is made of them
        r: GetTaskResult = await d.tasks.get_task(request.session_id, request.epoch,
                                            [TaskRef(f.task_id, f.epoch, f.attempt) for f in request.finished],
                                            max(1, request.max_tasks))
        # Built in place: the hot path of the master (one call per task).
        reply = pb.GetTaskResponse(outcome=_OUTCOMES[r.outcome], current_epoch=r.current_epoch)
        if r.finished_results:
            reply.finished_results.extend([pb.ACCEPTED if a else pb.STALE for a in r.finished_results])
        view = r.task
        if view is not None:
            task = reply.task
            task.id, task.epoch, task.attempt, task.format = view.task, view.epoch, view.attempt, view.format
            add = task.chunks.add
            for c in view.chunks:
                add(path=c.path, begin=c.begin, end=c.end)
            for more in r.more_tasks:
                task = reply.more_tasks.add(id=more.task, epoch=more.epoch, attempt=more.attempt,
                                            format=more.format)
                add = task.chunks.add
                for c in more.chunks:
                    add(path=c.path, begin=c.begin, end=c.end)
        if r.retry_after:
            reply.retry_after.CopyFrom(duration(r.retry_after))
        if r.split_poll:
            reply.split_poll.CopyFrom(duration(r.split_poll))
        return reply

    GetTask = _rpc(_get_task, name="GetTask")
    # a stream's message is held before it takes a slot (GetTaskStream)
    _get_task_of_stream = _wrap(_get_task, shed=False, name="GetTask", hold=False)

    async def GetTaskStream(self, requests, context: grpc.aio.ServicerContext):
        """GetTask for each request, in order, over one stream: gRPC's work per unary call is
        most of a GetTask's cost, and a message on an open stream costs a fraction of it. Each
        message runs GetTask's code (errors, its latency metric): an error aborts the stream
        with the status GetTask would answer, and the client opens another.

        Admission: a message is never shed. It waits its turn (FIFO) for one of
        STREAM_SLOTS slots of its own (unary calls keep theirs, so a registration still
        gets in past thousands of streams). Shedding is for unary calls, which would
        otherwise wait in gRPC's queue; a stream's next message waits in the stream, one per
        trainer, and shedding it would cost a new stream, as dear as a unary call, while
        every shed trainer opens its next one at once."""
        if not self.task_streams:  # trainers fall back to unary GetTask for good on this answer
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                "GetTaskStream is off on this master (--no-task-streams): call GetTask")
        metrics.TASK_STREAMS_OPENED.inc()
        metrics.TASK_STREAMS.inc()
        try:
            async for request in requests:
                if self.dispatcher() is None:
                    await self._hold(request, context)
                async with self.stream_slots:
                    reply = await self._get_task_of_stream(request, context)
                yield reply
        finally:
            metrics.TASK_STREAMS.dec()

    @_rpc
    async def TaskFinished(self, d: Dispatcher, request):
        return pb.TaskReportResponse(result=_result(await d.tasks.task_finished(request.session_id, _ref(request))))

    @_rpc
    async def TaskFailed(self, d: Dispatcher, request):
        reason = loggable(request.reason, limit=MAX_REASON)  # bounded and escaped: it is logged
        accepted = await d.tasks.task_failed(request.session_id, _ref(request), reason)
        return pb.TaskReportResponse(result=_result(accepted))

    @_rpc
    async def ReturnTask(self, d: Dispatcher, request):
        return pb.TaskReportResponse(result=_result(await d.tasks.return_task(request.session_id, _ref(request))))

    @_rpc
    async def SetDataset(self, d: Dispatcher, request):
        s = request.dataset
        spec = DatasetSpec(paths=tuple(s.paths), format=s.format, chunk_bytes=s.chunk_bytes,
                           chunks_per_task=s.chunks_per_task, num_epochs=s.num_epochs,
                           shuffle_seed=s.shuffle_seed)
        return pb.SetDatasetResponse(num_tasks=await d.dataset.set_dataset(spec))

    @_rpc
    async def RestartEpoch(self, d: Dispatcher, request):
        return pb.RestartEpochResponse(current_epoch=await d.epochs.restart(
            request.epoch, done=request.done_tasks, reopen=request.reopen))

    @_inspection
    async def GetStatus(self, d: Dispatcher, request):
        s = await inspection.status(d)
        return pb.GetStatusResponse(
            job=s.job, namespace=s.namespace, phase=s.phase, leader=s.leader,
            current_epoch=s.epoch, num_epochs=s.num_epochs, counts=pb.TaskCounts(**s.counts),
            num_tasks=s.num_tasks, trainers_alive=s.trainers_alive,
            pserver_endpoints=s.pservers, has_dataset=s.has_dataset, requeued=s.requeued,
            min_trainers=s.min_trainers, max_trainers=s.max_trainers,
            desired_trainers=s.desired_trainers, tasks_assigned=s.tasks_assigned,
            splits_this_epoch=s.splits_this_epoch, splits=s.splits,
            trainer_seconds=[pb.TrainerSeconds(cause=c, seconds=v)
                             for c, v in (s.trainer_seconds or {}).items()],
        )

    @_inspection
    async def ListTasks(self, d: Dispatcher, request):
        status = _task_status(request.state) if request.state else None
        epoch = request.epoch if request.HasField("epoch") else None
        tasks, token = inspection.list_tasks(d, status=status, epoch=epoch, page_size=request.page_size,
                                             page_token=request.page_token,
                                             reveal_sessions=caller().is_operator)
        return pb.ListTasksResponse(next_page_token=token, tasks=[
            pb.TaskInfo(id=t.task, state=pb.TaskState.Value(t.status.name), epoch=t.epoch,
                        holder=t.holder, session_id=t.session, attempt=t.attempt, failures=t.failures,
                        chunks=[pb.Chunk(path=c.path, begin=c.begin, end=c.end) for c in t.chunks])
            for t in tasks
        ])

    @_inspection
    async def ListTrainers(self, d: Dispatcher, request):
        views, token = inspection.list_trainers(d, page_size=request.page_size, page_token=request.page_token,
                                                reveal_sessions=caller().is_operator)
        return pb.ListTrainersResponse(next_page_token=token, trainers=[
            pb.TrainerInfo(trainer_id=v.trainer, session_id=v.session, tasks_held=v.tasks,
                           since_last_call=duration(v.since_last_call))
            for v in views
        ])

    @_rpc
    async def RequestSaveModel(self, d: Dispatcher, request):
        granted = await d.save_model.request(request.session_id, seconds(request.block))
        return pb.RequestSaveModelResponse(granted=granted)

    @_rpc
    async def ScaleTrainers(self, d: Dispatcher, request):
        span, desired = await d.scaling.scale(request.trainers)
        return pb.ScaleTrainersResponse(min_trainers=span.minimum, max_trainers=span.maximum,
                                        desired_trainers=desired)

    @_inspection  # an operator's action on a saturated master must get through
    async def EvictTrainer(self, d: Dispatcher, request):
        session, returned = await d.trainers.evict(request.trainer_id)
        return pb.EvictTrainerResponse(session_id=session, tasks_returned=returned)
