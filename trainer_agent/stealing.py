"""The trainer's side of work stealing (docs/design.md section 5a): stop where agreed.

At an epoch's end the master may ask, in a KeepAlive answer, to split a task this
trainer holds, so an idle trainer reads the rest. The keep-alive thread answers
(`Steals.answer`): it takes the reader's position — bytes into the task, a record
boundary: every record handed out starts before it, none starting at or after it was —
holds the reader there, and calls `SplitTask(position)`. The reader (`TaskCursor.read`,
in the training loop's thread) hands out no record starting at or past a proposed
position until the master's word is in: STOP ends the task there (its finish then
counts the part before it), CONTINUE lets it read on. So the reader never reads past a
point the master gives away, and the master never gives away a point it read past.

When the master's word is not known (the call failed every retry), the task is given
back, not acknowledged: a split that did happen is then read again from its start by
someone (records read twice, none lost), one that did not loses nothing either.

Readers that cannot say where their records start (unsplittable files, formats without
`positioned`) are held only between chunks: their position inside a chunk is its end.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from paddlecloud.api import pb
from trainer_agent.readers import read_chunk_at

logger = logging.getLogger(__name__)

_READ_ON, _ASKED, _STOP, _GIVE_BACK = "read on", "asked", "stop", "give back"


class TaskCursor:
    """Where the reader of one task is, and where it may have to stop. Thread-safe."""

    def __init__(self, task: pb.Task) -> None:
        self.task = task
        self._starts: list[int] = []  # each chunk's first byte, into the task's data
        total = 0
        for chunk in task.chunks:
            self._starts.append(total)
            total += chunk.end - chunk.begin
        self.length = total
        self._cond = threading.Condition()
        self._position = 0
        self._limit: int | None = None
        self._word = _READ_ON

    @property
    def give_back(self) -> bool:
        """The master's word on a split is not known: the task must go back, unacknowledged."""
        with self._cond:
            return self._word == _GIVE_BACK

    def propose(self) -> int | None:
        """Holds the reader at its position and returns it; None when a proposal is out already."""
        with self._cond:
            if self._word != _READ_ON:
                return None
            self._word, self._limit = _ASKED, self._position
            return self._limit

    def decide(self, word: str) -> None:
        """The master's answer to the proposal: `_STOP`, `_GIVE_BACK`, or `_READ_ON`."""
        with self._cond:
            self._word = word
            if word == _READ_ON:
                self._limit = None
            self._cond.notify_all()

    def _may_hand_out(self, at: int | None, then: int) -> bool:
        """May a record starting at `at` (into the task; None: where the last one ended) go
        out? If so the position is `then`."""
        with self._cond:
            if at is None:
                at = self._position
            while self._limit is not None and at >= self._limit and self._word == _ASKED:
                self._cond.wait()
            if self._limit is not None and at >= self._limit:
                return False  # stopped here (or giving back)
            self._position = max(self._position, then)
            return True

    def read(self, fmt: str) -> Iterator[Any]:
        """The task's raw records, stopping where the master and this trainer agreed."""
        for chunk, start in zip(self.task.chunks, self._starts, strict=True):
            chunk_end = start + chunk.end - chunk.begin
            self._may_hand_out(start, start)  # a new file's records start past the last one's end
            for offset, record in read_chunk_at(chunk, fmt):
                # positioned: the record starts where the last one ended (the first of a chunk
                # may lie past its start: a record the chunk before owned), the next at
                # `offset`; else the whole chunk goes out before the reader could stop again
                at, then = (start, chunk_end) if offset is None else (None, start + offset - chunk.begin)
                if not self._may_hand_out(at, then):
                    return
                yield record
            if not self._may_hand_out(chunk_end, chunk_end):
                return


class Steals:
    """The cursors of the tasks a client reads, and its answers to the master's split requests."""

    def __init__(self, *, held: Callable[[], list[pb.Task]],
                 split: Callable[[pb.TaskRef, int], int]) -> None:
        self._held = held
        self._split = split  # SplitTask through the session: the master's SplitAnswer
        self._lock = threading.Lock()
        self._cursors: dict[tuple[int, int], TaskCursor] = {}
        self.splits = 0  # tasks this trainer stopped short for another

    def cursor(self, task: pb.Task) -> TaskCursor:
        with self._lock:
            key = (task.id, task.attempt)
            found = self._cursors.get(key)
            if found is None:
                found = self._cursors[key] = TaskCursor(task)
            return found

    def done(self, task: pb.Task) -> None:
        with self._lock:
            self._cursors.pop((task.id, task.attempt), None)

    def answer(self, requests: list[pb.TaskRef]) -> None:
        """Answers a KeepAlive's split requests for the tasks still held (keep-alive thread)."""
        held = {(t.id, t.attempt): t for t in self._held()}
        for ref in requests:
            task = held.get((ref.task_id, ref.attempt))
            if task is None or task.epoch != ref.epoch:
                continue  # let go of meanwhile: its finish or return tells the master
            cursor = self.cursor(task)
            position = cursor.propose()
            if position is None:
                continue
            try:
                word = self._split(ref, position)
            except Exception as error:  # its outcome is unknown: give the task back
                logger.warning("split of task %d at byte %d: no answer (%s); giving it back",
                               task.id, position, error)
                cursor.decide(_GIVE_BACK)
                continue
            if word == pb.STOP:
                if position < cursor.length:
                    self.splits += 1
                    logger.info("task %d split at byte %d of %d: another trainer reads the rest",
                                task.id, position, cursor.length)
                cursor.decide(_STOP)
            elif word == pb.NOT_HELD:
                cursor.decide(_STOP)  # not ours now: whoever holds it reads it
            else:
                cursor.decide(_READ_ON)
