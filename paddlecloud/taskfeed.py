"""The task feed: a trainer program reads the master's tasks as files, with the standard library only.

A parameter-server job runs on a PS-capable PaddlePaddle (2.6.2), whose `protobuf<5` cannot load
paddlecloud's generated gRPC code (protobuf 7). So such a program does not talk to the master
itself: its launcher (`paddlecloud trainer`, in paddlecloud's own environment, started with
`PADDLECLOUD_TASK_FEED=1`) holds the master session, reads each task's records and hands the
program one file per task over a Unix socket whose path it puts in `$PADDLECLOUD_TASK_FEED`
(`trainer_agent.feed` is that side). The program trains on the file (Paddle's
`QueueDataset.set_filelist([task.path])` and `train_from_dataset`) and asks for the next:

    from paddlecloud.taskfeed import TaskFeed
    feed = TaskFeed.from_env()
    for epoch in feed.epochs():           # from the master's current epoch, until the job is done
        for task in epoch:                # task.path: the task's records, one per line
            train_on(task.path)           # asking for the next task acknowledges this one
        evaluate(epoch.number)

A task is acknowledged to the master (counted done, exactly once) only when the program asks for
the next one after it: a program killed while it trains on a task leaves that task unacknowledged,
and the master deals it again (its records may then reach the pservers twice: once in part, once
whole). The feed runs on paddlecloud's side; nothing here imports grpc, protobuf or paddlecloud's
other modules, so this file also runs in a Paddle 2.6.2 environment that has paddlecloud on its
path (`pip install --no-deps paddlecloud`, or the source tree on PYTHONPATH).

Wire: lines of UTF-8 text. The program sends `NEXT`; the feed answers `TASK <epoch> <task id>
<path>`, `EPOCH_END <epoch>`, `JOB_DONE`, or `ERROR <why>`.

What this does NOT do: let two programs share one feed (one connection at a time), or reconnect
(a program that loses the feed's socket has lost its launcher).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass

FEED_ENV = "PADDLECLOUD_TASK_FEED"


class FeedError(RuntimeError):
    """The feed answered an error, or went away."""


@dataclass(frozen=True)
class FeedTask:
    """One task of the master: its records in a file, one per line."""

    epoch: int
    task_id: int
    path: str


class FeedEpoch:
    """The tasks of one epoch, in the order the master deals them to this trainer."""

    def __init__(self, feed: TaskFeed, number: int, first: FeedTask | None) -> None:
        self.feed = feed
        self.number = number
        self._first = first
        self.tasks_read = 0

    def __iter__(self) -> Iterator[FeedTask]:
        task, self._first = self._first, None
        while task is not None:
            self.tasks_read += 1
            yield task
            kind, value = self.feed.next()
            if kind != "TASK" or value.epoch != self.number:
                self.feed.pending = (kind, value)
                return
            task = value


class TaskFeed:
    """The program's end of the feed (see the module docstring)."""

    def __init__(self, path: str, *, timeout: float | None = None) -> None:
        self.path = path
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.settimeout(timeout)
        try:
            self._socket.connect(path)
        except OSError as error:
            self._socket.close()
            raise FeedError(f"cannot reach the task feed at {path!r}: {error}") from None
        self._file = self._socket.makefile("rwb")
        self.pending: tuple[str, object] | None = None

    @classmethod
    def from_env(cls) -> TaskFeed:
        path = os.environ.get(FEED_ENV, "")
        if not path or path == "1":
            raise FeedError(f"${FEED_ENV} names no feed socket ({path!r}): run the program under "
                            f"`paddlecloud trainer` with {FEED_ENV}=1 (e.g. `paddlecloud local train "
                            f"-e {FEED_ENV}=1`)")
        return cls(path)

    def next(self) -> tuple[str, object]:
        """Asks for the next item (acknowledging the task before it): ("TASK", FeedTask),
        ("EPOCH_END", epoch) or ("JOB_DONE", None)."""
        try:
            self._file.write(b"NEXT\n")
            self._file.flush()
            line = self._file.readline().decode()
        except OSError as error:
            raise FeedError(f"the task feed at {self.path!r} went away: {error}") from None
        if not line:
            raise FeedError(f"the task feed at {self.path!r} closed")
        kind, _, rest = line.rstrip("\n").partition(" ")
        if kind == "TASK":
            epoch, task_id, path = rest.split(" ", 2)
            return kind, FeedTask(int(epoch), int(task_id), path)
        if kind == "EPOCH_END":
            return kind, int(rest)
        if kind == "JOB_DONE":
            return kind, None
        raise FeedError(f"the task feed said {line.strip()[:200]!r}")

    def epochs(self) -> Iterator[FeedEpoch]:
        """One FeedEpoch per epoch with tasks for this trainer, until the job is done."""
        while True:
            kind, value = self.pending or self.next()
            self.pending = None
            if kind == "JOB_DONE":
                return
            if kind == "EPOCH_END":  # an epoch in which this trainer got no task
                assert isinstance(value, int)
                yield FeedEpoch(self, value, None)
                continue
            assert isinstance(value, FeedTask)
            epoch = FeedEpoch(self, value.epoch, value)
            yield epoch
            if self.pending is None:
                return  # the caller left the epoch before its end: its launcher gives the rest back
            if self.pending[0] == "EPOCH_END":
                self.pending = None

    def close(self) -> None:
        for closing in (self._file.close, self._socket.close):
            try:
                closing()
            except OSError:
                pass

    def __enter__(self) -> TaskFeed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
