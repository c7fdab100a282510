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
turn, the next fetch starts with the last of them, and it carries all their acks.

The calls themselves are the core's asyncio client (`paddlecloud.master_client`, the one
every caller of a master uses): retries with backoff until `deadline` seconds have passed
(UNAVAILABLE, a shedding master's RetryInfo), the leader a standby names (NOT_LEADER's
`leader`) else a freshly resolved one, a session expired (SESSION_EXPIRED) registered
again, a superseded one (SESSION_SUPERSEDED) ending this client with `TrainerSuperseded`.
This module is its synchronous facade: `MasterConnection` runs the asyncio connection on
an event-loop thread of its own and each method waits for its coroutine there; `Session`
runs a call of the caller's thread between the steps of the asyncio session. The calls
travel over gRPC's synchronous stack (`paddlecloud.master_client.threaded_channel`), not
grpc.aio, which does not survive a fork: a trainer's DataLoader forks its workers, and
each worker opens a client of its own (`trainer_agent.paddle`).

Threads, and who owns what. Three threads use a client: the main thread (the training
loop: `epochs()`, `Epoch.records()`, `flush()`, `close()`), the prefetch thread (the next
`GetTask` while a task is read; it may register again too) and the connection's
event-loop thread, which runs every call, the registrations and the session's keep-alive
task (`KeepAlive` when no call carrying the session was answered for ttl/3, so a trainer
that calls GetTask more often sends none; it registers again when the session expired).
Each piece of state has one owner:

* the asyncio `MasterConnection` and `Session` (`paddlecloud.master_client`): the
  channels, the current master, the task stream, the session id and TTL, the
  supersession; touched on the event-loop thread only, so they need no lock (but the
  session's two counters of calls under way, guarded by its own lock).
* `TaskLedger`: the tasks held (being read or prefetched), those let go of lately, and
  the acknowledgements not yet delivered. The main thread holds and lets go; the
  prefetch thread takes the acks for its GetTask (and puts them back when the call
  failed); a registration, on the loop, forgets what the old session held.
* `TaskClient`: where the job is as last heard (`progress`: an immutable snapshot,
  replaced under the client's lock by registrations and by the main thread at the
  ends of epochs) and the counters.

Work stealing's split requests ride on KeepAlive answers: the keep-alive task hands them to
the client's one `steals` thread (`Steals`, trainer_agent.stealing), which holds the reader
of the task in question at its position until the master's word is in.

No lock is held across a call to the network: a thread waiting for a call waits on its
future only. `Epoch` owns nothing shared: it uses the client's and the ledger's public
methods.

What this does NOT guarantee: that a record is *read* once. A trainer that dies after
reading part of a task has those records read again by whoever takes the task next;
what is exactly once is the master's count of finished tasks per epoch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import random
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import grpc

from paddlecloud import master_client
from paddlecloud.api import pb
from paddlecloud.auth import ClientCredentials
from paddlecloud.master_client import (
    ConnectionClosed,
    MasterUnavailable,
    TrainerSuperseded,
    retry_delay,
)
from paddlecloud.master_client.connection import CALL_TIMEOUT
from paddlecloud.master_client.discovery import MasterLocator
from paddlecloud.master_client.session import EXPIRED_RETRIES
from paddlecloud.master_client.threaded_channel import ThreadedChannel
from paddlecloud.wire import seconds
from trainer_agent import termination
from trainer_agent.readers import DataError
from trainer_agent.stealing import Steals

logger = logging.getLogger(__name__)

__all__ = ["AllTasksFailed", "ConnectionClosed", "Epoch", "MasterConnection", "MasterUnavailable", "Session",
           "TaskClient", "TaskLedger", "TrainerSuperseded", "default_trainer_id", "retry_delay"]

T = TypeVar("T")


class AllTasksFailed(RuntimeError):
    """Every task of an epoch failed: the job has failed."""


def default_trainer_id() -> str:
    """`$PADDLE_TRAINER_ID`, else `<host>-<pid>`."""
    return os.environ.get("PADDLE_TRAINER_ID") or f"{socket.gethostname()}-{os.getpid()}"


def _waiting(name: str) -> Callable[..., Any]:
    """The facade's method `name`: the asyncio connection's coroutine of that name, waited for."""
    coroutine = getattr(master_client.MasterConnection, name)

    @functools.wraps(coroutine)
    def method(self: MasterConnection, *args: Any, **kwargs: Any) -> Any:
        return self.wait(getattr(self.aio, name)(*args, **kwargs))
    return method


class MasterConnection:
    """The synchronous facade of `paddlecloud.master_client.MasterConnection` (retries, leader
    following, credentials, task streams: see there), with the same methods. It runs that
    connection on an event-loop thread of its own; any thread may call it, each call waits
    for its coroutine there. Thread-safe.

    The calls go over gRPC's synchronous stack (`ThreadedChannel`), never grpc.aio, so that
    the process may fork (a Paddle DataLoader's workers) and a child may open a client of
    its own. A connection is of the process that made it: in a forked child its calls raise
    `ConnectionClosed` (its loop thread was not copied) instead of waiting for ever.
    `open_channel(address)` makes the synchronous grpc.Channel (default: the credentials').
    """

    def __init__(self, locator: MasterLocator, *, deadline: float,
                 credentials: ClientCredentials | None = None,
                 open_channel: Callable[[str], grpc.Channel] | None = None) -> None:
        self.locator = locator
        self.deadline = deadline
        credentials = credentials if credentials is not None else ClientCredentials.from_env()
        synchronous = open_channel or credentials.channel
        self._pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="master-connection", daemon=True)
        self._thread.start()
        self._closing = threading.Lock()
        self._closed = False
        self.aio = master_client.MasterConnection(
            locator, deadline=deadline, credentials=credentials,
            open_channel=lambda address: ThreadedChannel(synchronous(address)))

    @property
    def address(self) -> str | None:
        """The master's address the next call goes to (None before the first)."""
        return self.aio.address

    @property
    def credentials(self) -> ClientCredentials:
        return self.aio.credentials

    def wait(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Runs `coroutine` on the connection's loop and waits for it (Ctrl-C cancels it)."""
        if self._closed or self.forked:
            coroutine.close()
            raise self._closed_error()
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        except RuntimeError:  # its loop closed meanwhile
            coroutine.close()
            raise self._closed_error() from None
        try:
            return future.result()
        except concurrent.futures.CancelledError:  # closed during the call
            raise self._closed_error() from None
        except BaseException:
            future.cancel()
            raise

    @property
    def forked(self) -> bool:
        """This is a copy in a forked child: the parent's loop thread is not here."""
        return os.getpid() != self._pid

    def _closed_error(self) -> ConnectionClosed:
        if self.forked:
            return ConnectionClosed(
                f"connection to {self.locator.describe()} was opened in process {self._pid}, "
                f"not in this forked child ({os.getpid()}): open a client in the child")
        return ConnectionClosed(f"connection to {self.locator.describe()} is closed")

    def on_loop(self, callback: Callable[[], Any]) -> None:
        """Runs `callback` on the connection's loop soon (nothing once it is closed)."""
        if not self._closed:
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                self._loop.call_soon_threadsafe(callback)

    register_trainer = _waiting("register_trainer")
    keep_alive = _waiting("keep_alive")
    split_task = _waiting("split_task")
    leave_trainer = _waiting("leave_trainer")
    get_task = _waiting("get_task")
    task_finished = _waiting("task_finished")
    task_failed = _waiting("task_failed")
    return_task = _waiting("return_task")
    request_save_model = _waiting("request_save_model")
    get_status = _waiting("get_status")
    list_tasks = _waiting("list_tasks")
    _connect = _waiting("_connect")

    def close(self) -> None:
        """Closes every channel (calls under way end CANCELLED), then the loop; later calls
        raise ConnectionClosed."""
        with self._closing:
            if self._closed:
                return
            if self.forked:  # the parent's loop and channels are the parent's to close
                self._closed = True
                return
            asyncio.run_coroutine_threadsafe(self._shut(), self._loop).result()
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _shut(self) -> None:
        await self.aio.close()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:  # a call in its backoff, a keep-alive: its caller hears ConnectionClosed
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)


class Session:
    """The synchronous facade of `paddlecloud.master_client.Session`, on a facade connection.

    `run(call)` calls `call(session_id)` in the caller's thread (a call of the facade
    connection's, typically), registering first when there is no session and again when
    the master says it expired (SESSION_EXPIRED, up to EXPIRED_RETRIES times); once the
    master says it was superseded (SESSION_SUPERSEDED) every `run` raises
    `TrainerSuperseded`. `on_register(reply)` runs after each registration, on the
    connection's loop. The keep-alive task starts with the first registration and stops at
    `close()`.
    """

    def __init__(self, connection: MasterConnection, *, trainer_id: str,
                 on_register: Callable[[pb.RegisterTrainerResponse], None] | None = None) -> None:
        self.connection = connection
        self.trainer_id = trainer_id
        self.aio = master_client.Session(connection.aio, trainer_id=trainer_id, on_register=on_register)

    id = property(lambda self: self.aio.id, doc="The session id; 0 before the first registration.")
    active = property(lambda self: self.aio.active, doc="Registered and not superseded.")
    keepalives = property(lambda self: self.aio.keepalives, doc="KeepAlive calls sent.")
    beat_interval = property(lambda self: self.aio.beat_interval,
                             doc="Seconds between KeepAlives when no other call carries the session.")
    reregistrations = property(lambda self: self.aio.reregistrations,
                               doc="How often an expired session was registered again.")

    def register(self) -> None:
        """Registers a new session now (the master drops an older one of this trainer id)."""
        self.connection.wait(self.aio.register())
        termination.track(self)  # stopped with SIGTERM, the process leaves first

    def ensure(self) -> int:
        """The session id, registering first when there is no session."""
        if self.aio.active:  # the common case, read without a trip to the loop
            return self.aio.id
        registered = self.aio.id
        session = self.connection.wait(self.aio.ensure())
        if session != registered:
            termination.track(self)
        return session

    def run(self, call: Callable[[int], T]) -> T:
        """`call(session_id)`; registers again when the session expired meanwhile (the steps of
        `paddlecloud.master_client.Session.run`, the call in this thread)."""
        for attempt in range(EXPIRED_RETRIES + 1):
            session = self.ensure()
            sent = self.aio.begin()
            try:
                result = call(session)
                self.aio.answered(sent)
                return result
            except grpc.RpcError as error:
                self.aio.judge(session, error, attempt)
            finally:
                self.aio.end()
            self.connection.wait(self.aio.renew(session))
        raise AssertionError("unreachable")

    def leave(self, *, timeout: float = 5.0) -> None:
        """Ends the session at the master (its tasks return at once)."""
        self.connection.wait(self.aio.leave(timeout=timeout))

    def close(self) -> None:
        """Stops the keep-alive task: it starts no call after this (one under way ends when the
        connection closes)."""
        self.connection.on_loop(self.aio.close)
        termination.untrack(self)


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
        # work stealing: the master's split requests ride on KeepAlive answers; they are
        # answered in a thread of their own (the answer waits for a call: not on the loop)
        self.steals = Steals(held=self.tasks.held, split=lambda ref, position: self.session.run(
            lambda s: self.connection.split_task(s, ref, position)))
        self._stealer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="steals")
        self.session.aio.on_keep_alive = self._split_requests
        termination.install()  # here, in the main thread, before any thread registers
        self._lock = threading.Lock()  # for writers of `progress` and the counters
        self.progress = Progress()
        self._counts: Counter[str] = Counter()
        self._closed = False  # main thread only
        self._fetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="task-prefetch")
        # Sees every GetTask reply first, in the prefetch thread, and may replace it (e.g.
        # a loader worker that leaves its epoch to a sibling: trainer_agent.paddle).
        self.reply_filter: Callable[[pb.GetTaskResponse], pb.GetTaskResponse] | None = None

    def _split_requests(self, reply: pb.KeepAliveResponse) -> None:
        """On the loop: hands a KeepAlive's split requests to the steals thread."""
        if reply.split_requests and not self._closed:
            with contextlib.suppress(RuntimeError):  # shut down meanwhile
                self._stealer.submit(self.steals.answer, list(reply.split_requests))

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
        self.session.aio.beat_every(seconds(reply.split_poll))  # work stealing's tail, or as usual
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
            self._stealer.shutdown(wait=False, cancel_futures=True)
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
                except Exception as lost:
                    # The fetch in flight failed or timed out: whatever it may have dealt us
                    # returns to todo with our lease, so the exit goes on; say why.
                    logger.warning("epoch %d: the task fetch in flight at the loop's end failed "
                                   "(%s: %s); its task returns with the lease",
                                   self.number, type(lost).__name__, lost)
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
