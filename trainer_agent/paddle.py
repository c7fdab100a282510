"""PaddlePaddle on top of the master: a dataset over the task stream, checkpoints, uneven batches.

    dataset = MasterDataset(parse=parse_line)            # one session per iterating process
    loader = paddle.io.DataLoader(dataset, batch_size=64)
    while True:
        for x, y in loader:                              # the records of ONE epoch
            train_step(x, y)
        if dataset.job_done:
            break
        print("finished epoch", dataset.epoch)

``MasterDataset`` creates its ``TaskClient`` lazily, inside ``__iter__``, in the process
that iterates: with ``DataLoader(num_workers=N)`` every loader worker process has its
own session, trainer id ``<PADDLE_TRAINER_ID>/<worker id>``, and nothing of a parent's
client is ever used in a child (a forked copy is dropped, a pickled dataset carries
none). The loader forks its workers when an iteration starts: make no gRPC call from
another thread of the parent at that moment (gRPC skips its fork handlers while calls
are in flight, and the child can crash).

Checkpoints inside an epoch (``checkpoint_every``, default ``$PADDLECLOUD_CHECKPOINT_EVERY``:
every K tasks of the job, or every T seconds). A task is acknowledged once its records
went into batches (the loader reads ahead), and other trainers' acknowledgements arrive
late, so the master's done marks at any moment are not the tasks the model consumed.
The boundary protocol makes them known exactly:

1. Drain. Once the checkpoint is due, a trainer's iteration ends *between tasks*: after
   the last record of a task, it takes no new one and gives back what it prefetched
   (``Epoch.stop``). The loader emits its last, partial batch and ends.
2. Agree. ``join_batches`` ends only when every trainer is out of batches, so when the
   training loop reaches ``dataset.boundary()`` every record any trainer yielded went
   into an optimizer step that every trainer completed. ``boundary()`` flushes the
   acknowledgements and exchanges, with one ``all_gather``, each trainer's tasks read
   to their end in the segment, whether its epoch ended, and where the job is.
3. Save. Their union, plus the tasks a resumed checkpoint had consumed, is
   ``Boundary.tasks_done``: exactly the tasks whose records are all in the model's
   state at this moment, and no record of any other task is (nothing is half read).
   The trainer the master grants saves ``Boundary.train_status`` with the model; a
   group restart passes the tasks to ``RestartEpoch``, so the restarted epoch deals
   only the others, and a task the master deals anyway (a job started afresh on the
   checkpoint) is acknowledged unread.

Why drain rather than exclude the half-read tasks: excluding them from ``tasks_done``
would feed their already-trained records again after a restart, unless the checkpoint
also kept each one's record offset and the master could deal a task's remainder; it
cannot, so the only sound choice with whole tasks is to finish them first. A drain
costs little: a trainer finishes at most the task it is reading; prefetched tasks go
back to the master untouched.

A trainer whose session expired while it read (paused past its lease, cut off from the
master through a failover) had its tasks dealt again by the master: their records can
go into the model twice (its own read and another's, or its own twice). ``boundary()``
therefore fails with ``SessionLapsed`` on every trainer when any trainer's session was
registered again during the segment, before anything is saved: the trainers exit, and
the group restart resumes from the last checkpoint, which no step of the segment is in.

Preemption (``drain_on_stop=True``). SIGTERM — a node drain, an eviction, a queue's
suspend, a collective scale-down — makes the group stop at a boundary instead of dying
where it is: each trainer's reading ends between tasks (``trainer_agent.termination``),
``join_batches`` ends when every trainer is out, ``boundary()`` says ``stop`` on every
trainer (any one was stopped), and the program saves ``train_status`` and exits with
``termination.STOPPED_EXIT``. The next start resumes exactly there: a preemption loses no
task. The drain must fit in the backend's grace before SIGKILL: the task being read (at
most one per trainer; size them with ``--chunk-bytes``), one step, and the save.
``$PADDLECLOUD_STOP_GRACE`` (set by the backends) bounds it: past it the trainer leaves as
without a drain, and the last checkpoint stands. Needs ``num_workers=0``, like checkpoints
inside an epoch.

Not guaranteed: a task that fails on a bad record (``TaskFailed``) has had its records
before the bad one trained and is dealt again; it breaks "once" in the same way
without checkpoints. A session that lapses in the last segment of the job, once the
master has counted every task, fails the trainers before anything is saved; the group
restart that follows reopens the finished job at the last checkpoint (``RestartEpoch``
with ``reopen``), so the last segment is trained again, once.
Mid-epoch checkpoints need ``num_workers=0`` (the records read in the training
process, where the tasks read to their end are known): loader workers refuse them.
The trainers of the group choose their drain points on their own (K/N tasks each, or
T seconds from the last boundary); one that drains early joins the others' steps with
zero gradients until they drain too.

Loader workers and the end of an epoch: Paddle's DataLoader hands out the batches of
its workers in a fixed round-robin order, so a worker blocked waiting for the epoch to
end would stall the batches of a sibling that still holds a task, whose task would then
never finish: a deadlock. A worker told WAIT (nothing free for it) therefore stops
reading this epoch when a sibling of the same loader holds a task; the last one holding
nothing stays and waits for the master's end of the epoch, so a loop over the loader
still ends with the epoch.

``join_batches`` is for collective training (``paddle.DataParallel``), where dynamic
sharding gives trainers unequal numbers of batches: every step, the trainers agree with
one ``all_reduce`` on how many examples they hold and who still has data, so a trainer
that is out of data joins the others' steps with a zero gradient until every trainer is
out, as PyTorch DDP's ``Join`` does, and nobody hangs at the end of an epoch.

Paddle's C++ signal handler prints a crash report ("C++ Traceback ... FatalError:
`Termination signal` is detected") when the process gets SIGTERM, SIGSEGV, SIGABRT, ...;
under ``paddlecloud trainer`` (which sets ``PADDLECLOUD_PADDLE_SIGNAL_HANDLER=0`` unless
the environment sets it) importing this module removes that handler, so a stopped
trainer ends quietly and its launcher reports the signal in one line. Set
``PADDLECLOUD_PADDLE_SIGNAL_HANDLER=1`` to keep Paddle's report.

This is the only module of ``trainer_agent`` that imports paddle.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import paddle
import paddle.distributed as dist

from paddlecloud.api import pb
from trainer_agent import termination
from trainer_agent.checkpoint import (
    CheckpointError,
    CheckpointEvery,
    TrainStatus,
    load_checkpoint,
    save_checkpoint,
)
from trainer_agent.client import Epoch, TaskClient, default_trainer_id

logger = logging.getLogger(__name__)

if os.environ.get("PADDLECLOUD_PADDLE_SIGNAL_HANDLER") == "0":
    paddle.disable_signal_handler()

#: Loader worker processes a MasterDataset can coordinate (slots of shared memory).
MAX_WORKERS = 256

ClientFactory = Callable[..., TaskClient]


class SessionLapsed(RuntimeError):
    """A trainer's session expired during a segment: records of it may be in the model twice.

    Raised by ``MasterDataset.boundary()`` on every trainer of the group; only a restart
    from the last checkpoint (a group restart) undoes the segment.
    """


class MasterDataset(paddle.io.IterableDataset):
    """A ``paddle.io.IterableDataset`` over the master's tasks; each ``__iter__`` is one epoch.

    ``parse`` turns a raw record (a ``str`` line, or ``bytes`` for the ``file`` format)
    into a sample; a ``ValueError``/``KeyError``/``TypeError`` from it fails the task
    (``TaskFailed``). ``client_factory(trainer_id=..., parse=...)`` makes the client
    (default ``TaskClient.from_env``, which reads docs/design.md section 8's variables);
    ``trainer_id`` defaults to ``$PADDLE_TRAINER_ID`` in the iterating process.

    ``epoch`` is the epoch number of the last iteration (None before the first),
    ``job_done`` is true once an iteration found the job finished (it then yields
    nothing). Both are shared with loader worker processes. ``close()`` leaves the
    master (the session of this process; workers leave when their iteration ends).
    """

    def __init__(self, parse: Callable[[Any], Any] | None = None,
                 client_factory: ClientFactory | None = None, *,
                 trainer_id: str | None = None,
                 checkpoint_every: CheckpointEvery | None = None,
                 drain_on_stop: bool = False) -> None:
        super().__init__()
        # the DataLoader registers from a thread: install in this one
        if drain_on_stop:
            termination.drain_on_stop()  # a preemption saves where the model is (see above)
        else:
            termination.install()
        self.drain_on_stop = drain_on_stop
        self.parse = parse
        self.client_factory = client_factory
        self.trainer_id = trainer_id
        # Segments: an iteration ends between tasks when this says so (see boundary()).
        self.checkpoint_every = checkpoint_every or CheckpointEvery.from_env()
        self._segment: Epoch | None = None          # the last iteration's (training process)
        self._consumed: dict[int, set[int]] = {}    # epoch -> its tasks the model consumed
        self._client: TaskClient | None = None
        self._client_pid = 0
        # Shared with forked or spawned loader workers: [epoch (-1: none yet), job done,
        # a worker's session lapsed since the last boundary].
        self._progress = multiprocessing.RawArray("q", [-1, 0, 0])
        self._lapses = 0  # this process's client's re-registrations when its segment started
        # Per loader worker: 1 while it holds a task (guarded by _holding's lock).
        self._holding = multiprocessing.Array("b", MAX_WORKERS)

    # ---- what the training loop reads -----------------------------------------------

    @property
    def epoch(self) -> int | None:
        value = self._progress[0]
        return None if value < 0 else int(value)

    @property
    def job_done(self) -> bool:
        return bool(self._progress[1])

    @property
    def client(self) -> TaskClient | None:
        """This process's client, if it made one (None in the parent of loader workers)."""
        return self._client if self._client_pid == os.getpid() else None

    def request_save_model(self, *, block: float = 30.0) -> bool:
        """True when the master chose this trainer to save the model (one at a time).

        The grant goes by trainer id. It uses this process's session; when this process
        has none (only loader workers read), a session of the base trainer id is opened
        for the request and closed after it, so it never shows as an idle trainer.
        """
        client = self.client
        if client is not None:
            return client.request_save_model(block=block)
        factory = self.client_factory or TaskClient.from_env
        with factory(trainer_id=self._base_trainer_id(), parse=self.parse) as transient:
            return transient.request_save_model(block=block)

    def resume(self, status: TrainStatus | None) -> None:
        """Takes in the TrainStatus of the checkpoint the model was loaded from (None: none).

        A checkpoint saved inside an epoch lists the tasks of it the model consumed: they
        count in the next boundary's ``tasks_done``, and one the master deals again (a job
        started afresh on that checkpoint, without RestartEpoch) is acknowledged unread.
        """
        if status is not None and status.in_epoch:
            self._consumed[status.epoch] = set(status.tasks_done or ())

    def boundary(self, *, group: Any = None) -> Boundary:
        """After an iteration ended on every trainer (``join_batches`` returned): where the
        group is, agreed by all trainers (one ``all_gather``); call it on every trainer.

        Every record an iteration yielded went into a step that every trainer completed,
        and an iteration ends only between tasks (the drain), so each trainer's finished
        tasks are consumed whole; their union with the tasks a resumed checkpoint had
        consumed is the epoch's ``tasks_done``. Acknowledgements are flushed first.
        Raises ``SessionLapsed`` on every trainer when a session of any lapsed in the
        segment (see the module docstring).
        """
        client = self.client
        segment = self._segment
        if segment is not None and segment.client is not client:
            segment = None  # a forked copy's
        if client is not None:
            client.flush()
        mine = _Local(
            epoch=segment.number if segment is not None else (self.epoch or 0),
            ended=segment.ended if segment is not None else True,
            next_epoch=client.progress.current_epoch if client is not None else (self.epoch or 0),
            job_done=self.job_done,
            finished=sorted(segment.finished) if segment is not None else [],
            # loader workers read where this process cannot see: an epoch number says they did
            read=segment is not None if client is not None else self.epoch is not None,
            lapsed=self._lapsed(client),
            stopping=termination.stop_requested(),
        )
        self._segment = None
        everyone = _all_gather(mine, group=group)
        if any(m.lapsed for m in everyone):
            raise SessionLapsed(
                f"the session of trainer(s) {', '.join(str(i) for i, m in enumerate(everyone) if m.lapsed)} "
                "expired while reading: the master dealt their tasks again, so records may be in "
                "the model twice; restart the group from the last checkpoint")
        read = [m for m in everyone if m.read]
        epoch = min(m.epoch for m in read or everyone)
        over = any(m.ended for m in everyone)
        job_done = any(m.job_done for m in everyone)
        stop = any(m.stopping for m in everyone)
        if stop:
            termination.saving()  # the group agreed: what is left is the save
        if over:
            for number in [e for e in self._consumed if e <= epoch]:
                del self._consumed[number]
            following = max(m.next_epoch for m in everyone)
            if client is not None and following > client.progress.current_epoch:
                # a trainer that stopped between tasks hears of the epoch's end from the others
                client.advance(pb.GetTaskResponse(outcome=pb.EPOCH_DONE, current_epoch=following))
            if job_done:
                self._progress[1] = 1
            return Boundary(epoch=epoch, epoch_over=True, job_done=job_done, tasks_done=(),
                            read=bool(read), stop=stop and not job_done)
        done = self._consumed.setdefault(epoch, set())
        for m in everyone:
            done.update(m.finished)
        return Boundary(epoch=epoch, epoch_over=False, job_done=False, tasks_done=tuple(sorted(done)),
                        stop=stop)

    def _lapsed(self, client: TaskClient | None) -> bool:
        """A session of this trainer (this process's, or a loader worker's) was registered
        again after it expired, since its segment started."""
        lapsed = bool(self._progress[2])
        self._progress[2] = 0
        if client is not None:
            lapsed = lapsed or client.session.reregistrations > self._lapses
            self._lapses = client.session.reregistrations
        return lapsed

    def close(self) -> None:
        """Flushes acknowledgements, gives held tasks back and leaves, for this process's session."""
        client = self.client
        self._client = None
        if client is not None:
            client.close()

    def __enter__(self) -> MasterDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- iteration ----------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        if self.job_done:
            return  # known: no need for a session to hear it again
        info = paddle.io.get_worker_info()
        base = self._base_trainer_id()
        if info is None:
            yield from self._one_epoch(self._local_client(base))
            return
        # A loader worker: a session of its own, closed when its epoch ends (a worker
        # process may end right after, and multiprocessing children skip atexit).
        if info.id >= MAX_WORKERS:
            raise ValueError(f"MasterDataset supports at most {MAX_WORKERS} loader workers")
        if self.checkpoint_every is not None or self.drain_on_stop:
            why = (f"checkpoint every {self.checkpoint_every}" if self.checkpoint_every is not None
                   else "drain_on_stop")
            raise ValueError(f"{why}: checkpoints inside an epoch need the records read in the "
                             "training process (num_workers=0)")
        client = self._local_client(f"{base}/{info.id}")
        self._set_holding(info.id, False)  # whatever a dead predecessor left there
        try:
            _leave_on_idle(client, self._holding, info.id)
            yield from self._one_epoch(client)
        finally:
            self._set_holding(info.id, False)
            self._client = None
            client.close()
            if client.session.reregistrations:
                self._progress[2] = 1  # a fresh client each epoch: any re-registration is this one's

    def _one_epoch(self, client: TaskClient) -> Iterator[Any]:
        client.session.ensure()
        # a lapse between segments, holding nothing and owing no acks, took nothing back
        self._lapses = client.session.reregistrations
        if client.progress.finished:
            self._progress[1] = 1
            return
        number = client.progress.current_epoch
        epoch = Epoch(client, number, consumed=frozenset(self._consumed.get(number, ())))
        epoch.stop = self._drain_rule(epoch)
        self._segment = epoch
        self._progress[0] = epoch.number
        yield from epoch.records()
        client.flush()
        if client.progress.finished:
            self._progress[1] = 1  # seen at the end of the last epoch: no need to ask again

    def _drain_rule(self, epoch: Epoch) -> Callable[[], bool] | None:
        """Ends ``epoch``'s iteration between tasks once ``checkpoint_every`` is due (None: never)."""
        every = self.checkpoint_every
        if every is None:
            return None
        started = time.monotonic()
        trainers = dist.get_world_size() if dist.is_initialized() else int(
            os.environ.get("PADDLE_TRAINERS_NUM", "1"))
        return lambda: every.due(tasks=epoch.tasks_read, elapsed=time.monotonic() - started,
                                 trainers=trainers)

    def _base_trainer_id(self) -> str:
        return self.trainer_id or default_trainer_id()

    def _local_client(self, trainer_id: str) -> TaskClient:
        """This process's client; one inherited from a parent process is never touched."""
        if self._client is not None and self._client_pid == os.getpid():
            return self._client
        factory = self.client_factory or TaskClient.from_env
        self._client = factory(trainer_id=trainer_id, parse=self.parse)
        self._client_pid = os.getpid()
        return self._client

    def _set_holding(self, worker: int, holding: bool) -> None:
        with self._holding.get_lock():
            self._holding[worker] = int(holding)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None  # a session belongs to one process: never ship it
        state["_client_pid"] = 0
        state["_segment"] = None
        return state


@dataclass(frozen=True)
class Boundary:
    """Where every trainer's iteration ended: the epoch's end, or a checkpoint inside it.

    ``tasks_done`` (inside an epoch) are the epoch's tasks the model consumed, across
    every trainer and every restart; ``train_status`` is what to save with the model.
    ``stop``: a trainer of the group was stopped (SIGTERM, with ``drain_on_stop``): save,
    then exit with ``termination.STOPPED_EXIT`` on every trainer.
    """

    epoch: int
    epoch_over: bool
    job_done: bool
    tasks_done: tuple[int, ...]
    read: bool = True  # False: no trainer read anything (the job was done before): save nothing
    stop: bool = False

    @property
    def train_status(self) -> TrainStatus:
        if self.epoch_over:
            return TrainStatus(self.epoch)
        return TrainStatus(self.epoch, tasks_done=self.tasks_done)


@dataclass(frozen=True)
class _Local:
    """One trainer's side of a boundary (what ``all_gather`` exchanges)."""

    epoch: int
    ended: bool
    next_epoch: int
    job_done: bool
    finished: list[int]
    read: bool
    lapsed: bool = False
    stopping: bool = False


def _all_gather(mine: _Local, *, group: Any = None) -> list[_Local]:
    if not dist.is_initialized() or dist.get_world_size(group) <= 1:
        return [mine]
    everyone: list[Any] = []
    dist.all_gather_object(everyone, (mine.epoch, mine.ended, mine.next_epoch, mine.job_done,
                                      mine.finished, mine.read, mine.lapsed, mine.stopping),
                           group=group)
    return [_Local(int(e), bool(d), int(n), bool(j), [int(t) for t in f], bool(r), bool(x), bool(s))
            for e, d, n, j, f, r, x, s in everyone]


def _leave_on_idle(client: TaskClient, holding: Any, worker: int) -> None:
    """Makes a loader worker's epoch end when it is idle while a sibling holds a task.

    Filters the client's GetTask replies: after each the worker publishes whether it holds
    a task; a WAIT that finds it holding nothing while another worker of the loader
    holds one is turned into an end of its epoch (see the module docstring). Of
    workers that all hold nothing, none leaves, so the loader's iteration still ends
    with the master's epoch.
    """
    def leave_when_idle(reply: pb.GetTaskResponse) -> pb.GetTaskResponse:
        epoch = reply.current_epoch
        with holding.get_lock():
            holds = reply.outcome == pb.TASK or client.tasks.holding
            holding[worker] = int(holds)
            if reply.outcome == pb.WAIT and not holds and any(
                    holding[i] for i in range(len(holding)) if i != worker):
                logger.info("loader worker %d: nothing free while a sibling reads; "
                            "leaving epoch %d to it", worker, epoch)
                return pb.GetTaskResponse(outcome=pb.EPOCH_DONE, current_epoch=reply.current_epoch)
        return reply

    client.reply_filter = leave_when_idle


# ---- collective training with uneven data ---------------------------------------------


@dataclass(frozen=True)
class JoinStep:
    """One collective step: this trainer's batch (None when it is out) and the step's totals.

    ``loss_scale`` turns the *sum* of this trainer's per-example losses into its share
    of the mean over every example of the step, once ``paddle.DataParallel`` has
    averaged the gradients over ``world_size`` trainers (0 for a trainer without a
    batch: its backward pass contributes zero gradients).
    """

    batch: Any
    size: int
    total: int
    world_size: int

    @property
    def loss_scale(self) -> float:
        return self.world_size / self.total if self.batch is not None else 0.0


def join_batches(loader: Any, *, group: Any = None, poll: float = 0.02,
                 size: Callable[[Any], int] | None = None) -> Iterator[JoinStep]:
    """Steps of a collective epoch over ``loader``, in lockstep with every trainer of ``group``.

    Every step all trainers ``all_reduce`` (examples in hand, still has data): a step is
    yielded to everyone when anyone holds a batch, with ``batch=None`` on the trainers
    that hold none, and the iteration ends on every trainer at once, when all are out.
    A trainer whose loader is waiting for the master (the epoch's last tasks are being
    read elsewhere) must neither block inside the loader while the others wait for it
    in a collective, nor slow their steps down: the loader is read in a background
    thread, and a batch that is not ready when a step starts counts as none for that
    step. Only after a step in which no trainer had a batch does each wait up to
    ``poll`` seconds for one. With one trainer this is a plain loop over ``loader``. ``size(batch)`` counts a batch's examples (default: the
    first dimension of its first tensor or array).
    """
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    count = size or _batch_size
    if world <= 1:
        for batch in loader:
            n = count(batch)
            termination.note_progress()
            yield JoinStep(batch, n, n, 1)
        return
    # iter() here, not in the thread: a multi-process DataLoader sets signal handlers.
    feed = _Prefetcher(iter(loader))
    try:
        out = False
        wait = poll  # for the first batch, and after steps in which nobody had one
        while True:
            batch = None
            if not out:
                kind, value = feed.get(timeout=wait)
                if kind == "item":
                    batch = value
                elif kind == "end":
                    out = True
                elif kind == "error":
                    raise value
            n = count(batch) if batch is not None else 0
            flags = paddle.to_tensor([n, 0 if out else 1], dtype="int64")
            dist.all_reduce(flags, group=group)
            termination.note_progress()  # a drain still moves (see trainer_agent.termination)
            total, active = (int(v) for v in flags.numpy())
            if total == 0:
                if active == 0:
                    return
                wait = poll
                continue
            wait = 0.0
            yield JoinStep(batch, n, total, world)
    finally:
        feed.close()


def all_reduce_sum(values: list[float], *, group: Any = None) -> list[float]:
    """Sums ``values`` over every trainer (float64); the values themselves with one trainer."""
    if not dist.is_initialized() or dist.get_world_size(group) <= 1:
        return list(values)
    tensor = paddle.to_tensor(np.asarray(values, dtype=np.float64))
    dist.all_reduce(tensor, group=group)
    return [float(v) for v in tensor.numpy()]


def _batch_size(batch: Any) -> int:
    leaf = batch
    while isinstance(leaf, (list, tuple)) and leaf:
        leaf = leaf[0]
    if isinstance(leaf, Mapping) and leaf:
        return _batch_size(next(iter(leaf.values())))
    shape = getattr(leaf, "shape", None)
    if shape is None or len(shape) == 0:
        raise TypeError(f"cannot count the examples of a batch of {type(leaf).__name__}: pass size=")
    return int(shape[0])


class _Prefetcher:
    """Drains an iterator in a daemon thread; the consumer polls with a timeout."""

    def __init__(self, iterator: Iterator[Any], depth: int = 2) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(iterator,), name="join-prefetch",
                                        daemon=True)
        self._thread.start()

    def _run(self, iterator: Iterator[Any]) -> None:
        try:
            for item in iterator:
                if not self._put(("item", item)):
                    return
        except BaseException as error:  # handed to the consumer, raised there
            self._put(("error", error))
            return
        self._put(("end", None))

    def _put(self, entry: tuple[str, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def get(self, timeout: float) -> tuple[str, Any]:
        """The next entry, or ("none", None) when there is none within ``timeout`` (0: now)."""
        try:
            return self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
        except queue.Empty:
            return ("none", None)

    def close(self) -> None:
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=10)


# ---- checkpoints of Paddle models -----------------------------------------------------


def to_numpy(value: Any) -> Any:
    """A state dict (nested dicts/lists of tensors) with every tensor as a numpy array."""
    if isinstance(value, paddle.Tensor):
        return np.array(value.numpy(), copy=True)
    if isinstance(value, Mapping):
        return {k: to_numpy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_numpy(v) for v in value)
    return value


def to_tensors(value: Any) -> Any:
    """The inverse of ``to_numpy``: every numpy array back to a ``paddle.Tensor``."""
    if isinstance(value, np.ndarray):
        return paddle.to_tensor(value)
    if isinstance(value, Mapping):
        return {k: to_tensors(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_tensors(v) for v in value)
    return value


def save_paddle_checkpoint(path: str, model: paddle.nn.Layer, optimizer: Any,
                           train_status: TrainStatus, *, keep: int = 3,
                           extra: Mapping[str, Any] | None = None) -> str:
    """``save_checkpoint`` of the model's and optimizer's ``state_dict()`` as numpy arrays.

    Pass the inner layer of a ``paddle.DataParallel``. ``optimizer`` may be None.
    ``extra`` (picklable values, e.g. a step counter) is saved beside them and read back
    by ``load_paddle_checkpoint_extra``. Returns the version's path.
    """
    state: dict[str, Any] = {"model": to_numpy(model.state_dict())}
    if extra is not None:
        state["extra"] = dict(extra)
    if optimizer is not None:
        state["optimizer"] = to_numpy(optimizer.state_dict())
        # The optimizer's keys embed global parameter names ("linear_0.w_0_moment1_0"),
        # which depend on how many layers the process built before: keep the model's
        # own names for them, so a process that numbers its layers differently loads it.
        state["parameter_names"] = {name: p.name for name, p in model.named_parameters()}
    return save_checkpoint(path, state, train_status, keep=keep)


def load_paddle_checkpoint(path: str, model: paddle.nn.Layer,
                           optimizer: Any = None) -> TrainStatus | None:
    """Loads the newest checkpoint under ``path`` into ``model`` (and ``optimizer``).

    Returns its TrainStatus, or None (nothing changed) when there is no checkpoint.
    Raises CheckpointError when the checkpoint does not hold a model state.
    """
    found = load_paddle_checkpoint_extra(path, model, optimizer)
    return None if found is None else found[0]


def load_paddle_checkpoint_extra(path: str, model: paddle.nn.Layer, optimizer: Any = None
                                 ) -> tuple[TrainStatus, dict[str, Any]] | None:
    """``load_paddle_checkpoint``, with the ``extra`` values the checkpoint was saved with."""
    found = load_checkpoint(path)
    if found is None:
        return None
    state, status = found
    if "model" not in state:
        raise CheckpointError(f"checkpoint in {path} (epoch {status.epoch}) holds no 'model' state")
    model.set_state_dict(to_tensors(state["model"]))
    if optimizer is not None and "optimizer" in state:
        saved = state.get("parameter_names", {})
        here = {name: p.name for name, p in model.named_parameters()}
        renames = {saved[n]: here[n] for n in saved if n in here and saved[n] != here[n]}
        optimizer.set_state_dict(to_tensors(_rename_parameters(state["optimizer"], renames)))
    return status, dict(state.get("extra", {}))


def _rename_parameters(optimizer_state: dict[str, Any], renames: dict[str, str]) -> dict[str, Any]:
    """The optimizer state with keys of parameter ``old`` (``old`` or ``old_<accumulator>``) renamed."""
    if not renames:
        return optimizer_state
    longest_first = sorted(renames, key=len, reverse=True)

    def rename(key: str) -> str:
        for old in longest_first:
            if key == old or key.startswith(old + "_"):
                return renames[old] + key[len(old):]
        return key

    out: dict[str, Any] = {}
    for key, value in optimizer_state.items():
        if key == "master_weights" and isinstance(value, Mapping):
            out[key] = {rename(k): v for k, v in value.items()}
        elif key == "LR_Scheduler":
            out[key] = value
        else:
            out[rename(key)] = value
    return out
