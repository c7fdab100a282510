"""The work-stealing room: at an epoch's end, an idle trainer gets the unread rest of a
straggler's task, and every record is still read exactly once (docs/design.md section 5a).

Why a protocol and not a backup task: a backup copy (MapReduce's) feeds the records
twice; cutting a task without its holder's word races its reader. So the cut is agreed:

1. A trainer that holds nothing asks for a task when none is left to deal (`idle`): the
   master picks a pending task of another trainer and *asks* to split it (in memory only:
   a request lost in a failover costs a split, nothing else).
2. The holder hears of it on its next KeepAlive (`requests_for`), notes the position it
   has read up to (a record boundary: no record it handed out starts past it, none
   starting there was), holds its reader there, and answers `SplitTask(position)`.
3. `split` cuts the task there in one etcd transaction (`master.state.TaskSplit`: the
   assignment must still be that attempt) and answers STOP; the rest is a new unit, a
   *piece*, dealt at once to the idle trainer that asked (its next GetTask brings it), else
   first to whoever asks. Or it answers CONTINUE (no cut: the request is gone, the rest
   too small, stealing off) and the reader reads on. Only after STOP does the holder stop;
   its finish then counts its part done, fenced by its attempt as every finish is.

A split is a task-state event like any other: after a failover the cut extents and the
pieces are read back from etcd (`extents/<epoch>/<unit>`).

What this does NOT do: split a task its holder does not answer for (an old client that
ignores `split_requests` is never cut), or cut inside a chunk that cannot be split
(a compressed file, the `file` format): such a holder names the end of its chunk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from master import metrics
from master.core import Core, InvalidArgument
from master.partition import ChunkRange, Partition
from master.sessions import SessionExpired, SessionSuperseded
from master.state import (
    Assignment,
    InvalidTransition,
    JobState,
    TaskAssigned,
    TaskSplit,
    TaskStatus,
)
from master.trainers import Trainers

logger = logging.getLogger(__name__)

# The least rest worth a split: a smaller one costs the idle trainer a dispatch for a
# record or two, and the holder a stop, for nothing it would not finish at once itself.
MIN_STEAL_BYTES = 64
PICK_AMONG = 64  # pending units an idle trainer's request looks at, at most
# How often a holder of the epoch's last tasks is asked to call KeepAlive (`split_poll`), so a
# split request reaches it within about that long, not ttl/3: every SPLIT_POLL seconds, slower
# when more trainers hold tasks, so that their KeepAlives stay near POLLS_PER_SECOND.
SPLIT_POLL = 1.0
POLLS_PER_SECOND = 200


class SplitAnswer:
    STOP = "STOP"
    CONTINUE = "CONTINUE"
    NOT_HELD = "NOT_HELD"


@dataclass(frozen=True, slots=True)
class SplitRequest:
    task: int
    epoch: int
    attempt: int


def extent_of(partition: Partition, state: JobState, unit: int) -> tuple[int, int, int]:
    """(root task, lo, hi): the bytes of its root task `unit` owns (all of it when uncut)."""
    cut = state.extent(unit)
    if cut is not None:
        return cut
    return unit, 0, sum(c.end - c.begin for c in partition.task_chunks(unit))


def clip(chunks: list[ChunkRange], lo: int, hi: int) -> list[ChunkRange]:
    """The part [lo, hi) of `chunks` laid end to end, as chunks (empty parts left out)."""
    out: list[ChunkRange] = []
    start = 0
    for chunk in chunks:
        length = chunk.end - chunk.begin
        a, b = max(lo, start), min(hi, start + length)
        if a < b:
            out.append(ChunkRange(chunk.path, chunk.begin + a - start, chunk.begin + b - start))
        start += length
    return out


def unit_chunks(partition: Partition, state: JobState | None, unit: int) -> list[ChunkRange]:
    """The chunks a task or a piece owns in the current epoch."""
    cut = state.extent(unit) if state is not None else None
    if cut is None:
        return partition.task_chunks(unit)
    root, lo, hi = cut
    return clip(partition.task_chunks(root), lo, hi)


def inside_whole_chunk(partition: Partition, root: int, at: int) -> bool:
    """True when byte `at` of task `root` lies strictly inside a chunk that cannot be cut."""
    start = 0
    for chunk, splittable in partition.task_chunks_splittable(root):
        length = chunk.end - chunk.begin
        if start < at < start + length:
            return not splittable
        start += length
    return False


class Stealing:
    def __init__(self, core: Core, trainers: Trainers) -> None:
        self.core = core
        self.trainers = trainers
        self.splits = 0  # since this master leads
        self._wanted: dict[int, tuple[int, int]] = {}  # unit -> (attempt asked to split, idle session)
        self._asked_for: dict[int, int] = {}  # idle session -> the unit asked on its behalf
        self._lock = asyncio.Lock()  # one split at a time: each takes the next piece id

    @property
    def enabled(self) -> bool:
        return self.core.policy.work_stealing

    def idle(self, session: int, state: JobState) -> None:
        """`session` holds nothing and nothing is left to deal: ask a straggler to split."""
        if not self.enabled or state.held_by(session) or state.epoch_complete:
            return
        if state.counts[TaskStatus.TODO] or state.reserved:
            return
        asked = self._asked_for.get(session)
        if asked is not None and self._still_wanted(asked, state):
            return  # its request is still out
        victim = self._pick(state, session)
        if victim is not None:
            self._wanted[victim] = (state.pending[victim].attempt, session)
            self._asked_for[session] = victim

    def _pick(self, state: JobState, idle: int) -> int | None:
        """Of the first PICK_AMONG pending units of other sessions not asked yet, the one
        with the most bytes (a bounded look: thousands of trainers idle at once at an
        epoch's end each ask, every half second)."""
        partition = self.core.partition
        assert partition is not None
        best, best_size, seen = None, 0, 0
        for unit, assignment in state.pending.items():
            if assignment.session == idle or state.writing(unit) or (
                    unit in self._wanted and self._still_wanted(unit, state)):
                continue
            _, lo, hi = extent_of(partition, state, unit)
            if hi - lo > best_size:
                best, best_size = unit, hi - lo
            seen += 1
            if seen >= PICK_AMONG:
                break
        return best if best_size >= MIN_STEAL_BYTES else None

    def _still_wanted(self, unit: int, state: JobState) -> bool:
        """The request on `unit` stands: the assignment asked is still live; else it is dropped."""
        asked = self._wanted.get(unit)
        live = state.pending.get(unit)
        if asked is not None and live is not None and live.attempt == asked[0]:
            return True
        self._wanted.pop(unit, None)
        return False

    def split_poll(self, state: JobState) -> float:
        """Seconds between a tail holder's KeepAlives while nothing is left to deal; 0 otherwise."""
        if not self.enabled or state.counts[TaskStatus.TODO] or state.epoch_complete:
            return 0.0
        poll = max(SPLIT_POLL, len(state.pending) / POLLS_PER_SECOND)
        return poll if poll < self.core.policy.session_ttl / 3 else 0.0

    def requests_for(self, session: int) -> list[SplitRequest]:
        """The splits asked of `session`'s tasks, for its KeepAlive answer."""
        state = self.core.state
        if state is None or not self._wanted:
            return []
        found = []
        for unit in state.held_by(session):
            live = state.pending.get(unit)
            if live is not None and self._wanted.get(unit, (0, 0))[0] == live.attempt:
                found.append(SplitRequest(unit, state.epoch, live.attempt))
        return found

    async def split(self, session: int, task: int, epoch: int, attempt: int, position: int) -> str:
        """`SplitTask`: cut the holder's task at `position` (bytes into its data) if still wanted."""
        if position < 0:
            raise InvalidArgument(f"split position {position} is negative: bytes into the task count from 0")
        async with self.core.admitted(), self._lock:
            try:
                await self.trainers.touch(session)
            except (SessionExpired, SessionSuperseded):
                return SplitAnswer.NOT_HELD
            state, partition = self.core.state, self.core.partition
            if state is None or partition is None:
                return SplitAnswer.NOT_HELD
            live = state.live_assignment(task, epoch, attempt)
            if live is None or live.session != session:
                return SplitAnswer.NOT_HELD
            root, lo, hi = extent_of(partition, state, task)
            at = lo + position
            if at >= hi:
                return SplitAnswer.STOP  # nothing lies past it: stop where the task ends anyway
            attempt_asked, idle = self._wanted.pop(task, (0, 0))
            if attempt_asked != attempt or not self.enabled or hi - at < MIN_STEAL_BYTES:
                return SplitAnswer.CONTINUE
            if inside_whole_chunk(partition, root, at):
                raise InvalidArgument(f"split position {position} of task {task} lies inside a chunk "
                                      "that cannot be split (compressed, or the file format)")
            event = TaskSplit(task, attempt, root, lo, at, hi, piece=state.units)
            if await self.core.commit(event) is None:
                still = state.live_assignment(task, epoch, attempt)
                return SplitAnswer.CONTINUE if still is not None else SplitAnswer.NOT_HELD
            self.splits += 1
            metrics.SPLITS.inc()
            logger.info("task %d (attempt %d) split at byte %d of task %d: bytes [%d, %d) are piece %d",
                        task, attempt, at, root, at, hi, event.piece)
            await self._hand(event.piece, idle)
            return SplitAnswer.STOP

    async def _hand(self, piece: int, session: int) -> None:
        """Deals `piece` to the idle `session` that asked for it, if it is still there and
        idle: else the piece waits in todo, first, for whoever asks (the straggler itself
        would otherwise take it with its next prefetch)."""
        state = self.core.state
        info = self.core.sessions.by_session.get(session)
        if state is None or info is None or state.held_by(session):
            return
        timeout = self.core.policy.task_timeout
        assignment = Assignment(session, info.trainer, 0, time.time() + timeout if timeout else 0.0)
        try:
            if await self.core.commit(TaskAssigned(piece, assignment)) is not None:
                metrics.DISPATCHES.inc()
        except InvalidTransition:
            pass  # taken meanwhile: it is dealt already
        except Exception as error:  # the split stands: its answer must still be STOP
            logger.warning("piece %d not dealt to session %d (%s): it waits in todo", piece, session, error)
