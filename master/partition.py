"""Cuts a frozen file list into chunks and tasks, without reading any data.

A splittable file of `size` bytes gives ceil(size / chunk_bytes) byte ranges; a
compressed file, or any file in the `file` format, is one chunk; an empty file
gives none. Task t owns chunks [t*k, (t+1)*k) of the concatenated chunk list, so
tasks may span files. Lookups are O(log files) through cumulative counts: the
master keeps no per-chunk object, which is what lets a million chunks fit.
"""

from __future__ import annotations

import bisect
import random
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


def task_order(num_tasks: int, *, seed: int, epoch: int) -> list[int]:
    """The order tasks are dealt in for one epoch: a shuffle reproducible from (seed, epoch)."""
    order = list(range(num_tasks))
    random.Random(f"paddlecloud:{seed}:{epoch}").shuffle(order)
    return order
