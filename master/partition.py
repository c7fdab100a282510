"""Cuts a frozen file list into chunks and tasks, without reading any data.

A splittable file of `size` bytes gives ceil(size / chunk_bytes) byte ranges; a
compressed file, or any file in the `file` format, is one chunk; an empty file
gives none. Task t owns chunks [t*k, (t+1)*k) of the concatenated chunk list, so
tasks may span files. Lookups are O(log files) through cumulative counts: the
master keeps no per-chunk object, which is what lets a million chunks fit.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from paddlecloud.datasets import FileEntry

COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")


def is_compressed(path: str) -> bool:
    return path.lower().endswith(COMPRESSED_SUFFIXES)


@dataclass(frozen=True)
class ChunkRange:
    path: str
    begin: int
    end: int


class Partition:
    def __init__(self, files: list[FileEntry], *, chunk_bytes: int, chunks_per_task: int,
                 splits_files: bool) -> None:
        if chunk_bytes <= 0 or chunks_per_task <= 0:
            raise ValueError(f"chunk_bytes {chunk_bytes} and chunks_per_task {chunks_per_task} must be > 0")
        self.files = files
        self.chunk_bytes = chunk_bytes
        self.chunks_per_task = chunks_per_task
        self._splits = [splits_files and not is_compressed(f.path) for f in files]
        self._first_chunk: list[int] = []  # index of each file's first chunk
        total = 0
        for entry, splits in zip(files, self._splits, strict=True):
            self._first_chunk.append(total)
            total += self._chunks_in(entry, splits)
        self.num_chunks = total
        self.num_tasks = -(-total // chunks_per_task)

    def _chunks_in(self, entry: FileEntry, splits: bool) -> int:
        if entry.size <= 0:
            return 0
        return -(-entry.size // self.chunk_bytes) if splits else 1

    def chunk(self, index: int) -> ChunkRange:
        if not 0 <= index < self.num_chunks:
            raise IndexError(f"chunk {index} out of range 0..{self.num_chunks - 1}")
        # the last file whose first chunk is <= index (empty files share a start; skip them)
        f = bisect.bisect_right(self._first_chunk, index) - 1
        entry = self.files[f]
        if not self._splits[f]:
            return ChunkRange(entry.path, 0, entry.size)
        offset = (index - self._first_chunk[f]) * self.chunk_bytes
        return ChunkRange(entry.path, offset, min(offset + self.chunk_bytes, entry.size))

    def task_chunks(self, task: int) -> list[ChunkRange]:
        if not 0 <= task < self.num_tasks:
            raise IndexError(f"task {task} out of range 0..{self.num_tasks - 1}")
        first = task * self.chunks_per_task
        last = min(first + self.chunks_per_task, self.num_chunks)
        return [self.chunk(i) for i in range(first, last)]

    def task_chunks_splittable(self, task: int) -> list[tuple[ChunkRange, bool]]:
        """`task_chunks(task)`, each with whether a reader may start inside it (work stealing
        cuts tasks only where one may: master.stealing)."""
        chunks = self.task_chunks(task)
        first = task * self.chunks_per_task
        return [(chunk, self._splits[bisect.bisect_right(self._first_chunk, first + i) - 1])
                for i, chunk in enumerate(chunks)]


_MASK64 = (1 << 64) - 1
_ROUNDS = 4


class Permutation:
    """A seeded permutation of [0, n), computed one position at a time (O(1) memory).

    A balanced Feistel network over the smallest even-bit domain 2^2h >= n, walked
    in cycles until the value falls in [0, n): a bijection of [0, n) whatever the
    keys. The round keys come from blake2b of (seed, epoch), and the rounds are
    integer arithmetic only, so every master, process and Python version computes
    the same order. Not a cryptographic shuffle: it only has to look random.
    """

    __slots__ = ("n", "_half", "_mask", "_keys")

    def __init__(self, n: int, *, seed: int, epoch: int) -> None:
        if n < 0:
            raise ValueError(f"permutation size {n} is negative")
        self.n = n
        self._half = max(1, ((n - 1).bit_length() + 1) // 2)
        self._mask = (1 << self._half) - 1
        digest = hashlib.blake2b(f"paddlecloud:{seed}:{epoch}".encode(), digest_size=8 * _ROUNDS).digest()
        self._keys = tuple(int.from_bytes(digest[8 * i:8 * i + 8], "little") | 1 for i in range(_ROUNDS))

    def __len__(self) -> int:
        return self.n

    def _encrypt(self, x: int) -> int:
        half, mask = self._half, self._mask
        left, right = x >> half, x & mask
        for key in self._keys:
            mixed = ((right ^ key) * 0x9E3779B97F4A7C15) & _MASK64
            left, right = right, left ^ ((mixed ^ (mixed >> 29)) & mask)
        return (left << half) | right

    def _decrypt(self, x: int) -> int:
        half, mask = self._half, self._mask
        left, right = x >> half, x & mask
        for key in reversed(self._keys):
            mixed = ((left ^ key) * 0x9E3779B97F4A7C15) & _MASK64
            left, right = right ^ ((mixed ^ (mixed >> 29)) & mask), left
        return (left << half) | right

    def index(self, task: int) -> int:
        """The position of `task` in the order: the inverse of `self[position]`."""
        if not 0 <= task < self.n:
            raise IndexError(f"task {task} out of range 0..{self.n - 1}")
        position = self._decrypt(task)
        while position >= self.n:
            position = self._decrypt(position)
        return position

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.n:
            raise IndexError(f"position {index} out of range 0..{self.n - 1}")
        value = self._encrypt(index)
        while value >= self.n:  # cycle walking: stays a bijection of [0, n)
            value = self._encrypt(value)
        return value

    def __iter__(self) -> Iterator[int]:
        return (self[i] for i in range(self.n))


def task_order(num_tasks: int, *, seed: int, epoch: int) -> Permutation:
    """The order tasks are dealt in for one epoch: a shuffle reproducible from (seed, epoch)."""
    return Permutation(num_tasks, seed=seed, epoch=epoch)


class DealQueue:
    """The tasks left to deal in an epoch, without a list of them all.

    The order is a function of the epoch's state alone, so a master that rebuilds its
    cache from etcd deals in the same order as the one that ran (docs/design.md
    section 5): first the pieces work stealing split off (ids past the permutation's,
    the newest first: docs/design.md section 5a), then every healthy task left, by its position in the epoch's
    permutation (a task given back returns to its own place, which lies before every
    task not dealt yet: given back, it holds the epoch's end back); then the tasks
    that failed in this epoch, by the etcd revision of their last failure (the mod
    revision of their `failures/` key), ties by position (a poisoned task must not
    crowd out healthy ones). Tasks given back sit in `front`, failed ones in `back`
    (heaps); the permutation's part is lazy: a position is skipped when `is_todo(task)`
    says the task is no longer to deal (done, held, or queued in front/back since), so
    marking a task done or held needs no removal here.
    """

    __slots__ = ("_order", "_cursor", "_front", "_back", "_queued", "_is_todo", "_rest", "_seen")

    def __init__(self, order: Permutation, is_todo: Callable[[int], bool]) -> None:
        self._order = order
        self._cursor = 0
        self._front: list[tuple[int, int]] = []        # heap of (position, task)
        self._back: list[tuple[int, int, int]] = []    # heap of (failure revision, position, task)
        self._queued: set[int] = set()  # in front or back
        self._is_todo = is_todo
        self._rest: deque[tuple[int, int]] | None = None  # see `restrict`
        # (position, task) of the last permutation lookup: a deal peeks, then takes, the same
        # position, and each lookup is a few rounds of the cipher
        self._seen = (-1, -1)

    def restrict(self, left: list[int]) -> None:
        """Only `left` remain of the permutation (a restore late in an epoch): they are put
        in permutation order now, so no deal walks the positions of the tasks done."""
        index = self._order.index
        self._rest = deque(sorted((index(task), task) for task in left))

    def _skip(self) -> tuple[int, int] | None:
        """(position, task) of the permutation's next task to deal, the cursor moved onto
        it; None at its end."""
        is_todo, queued = self._is_todo, self._queued
        if self._rest is not None:
            rest = self._rest
            while rest and not (is_todo(rest[0][1]) and rest[0][1] not in queued):
                rest.popleft()
            return rest[0] if rest else None
        order, n = self._order, self._order.n
        while self._cursor < n:
            position, task = self._seen
            if position != self._cursor:
                task = order[self._cursor]
                self._seen = (self._cursor, task)
            if is_todo(task) and task not in queued:
                return self._seen
            self._cursor += 1
        return None

    def peek(self) -> int | None:
        """The next task to deal (None when nothing is left)."""
        following = self._skip()
        front = self._front
        if front and (following is None or front[0][0] < following[0]):
            return front[0][1]
        if following is not None:
            return following[1]
        return self._back[0][2] if self._back else None

    def take(self, task: int) -> None:
        """`task` is dealt (it was to deal: the caller checked)."""
        if task in self._queued:
            self._queued.discard(task)
            for heap in (self._front, self._back):
                if heap and heap[0][-1] == task:
                    heapq.heappop(heap)
                    return
            for heap in (self._front, self._back):  # taken out of turn (a test, a replay)
                for i, item in enumerate(heap):
                    if item[-1] == task:
                        heap[i] = heap[-1]
                        heap.pop()
                        heapq.heapify(heap)
                        return
        following = self._skip()
        if following is not None and following[1] == task:
            if self._rest is not None:
                self._rest.popleft()
            else:
                self._cursor += 1
        # else: a task from the permutation's middle; its status skips it there

    def push_front(self, task: int) -> None:
        """`task` was given back, or is a new piece: it is dealt at its position."""
        heapq.heappush(self._front, (self._position(task), task))
        self._queued.add(task)

    def push_back(self, task: int, revision: int) -> None:
        """`task` failed (last at etcd `revision`): it is dealt after every healthy task."""
        heapq.heappush(self._back, (revision, self._position(task), task))
        self._queued.add(task)

    def _position(self, task: int) -> int:
        """A task's place in the permutation; a piece (work stealing: an id past the
        permutation's, docs/design.md section 5a) lies before every task, the newest
        first: it holds the epoch's end back, and an idle trainer is waiting for it."""
        return self._order.index(task) if task < self._order.n else -1 - task

    def __iter__(self) -> Iterator[int]:
        """Every task left, in deal order (O(n): for inspection and tests)."""
        order, is_todo, queued = self._order, self._is_todo, self._queued
        rest = (self._rest if self._rest is not None
                else ((i, order[i]) for i in range(self._cursor, order.n)))
        healthy = ((position, task) for position, task in rest if is_todo(task) and task not in queued)
        for _, task in heapq.merge(sorted(self._front), healthy):
            yield task
        for item in sorted(self._back):
            yield item[2]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DealQueue):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  (mutable)
