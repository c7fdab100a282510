"""Cutting a frozen file list into chunks and tasks (`master.partition`), as PaddlePaddle's
Go master suite had it (go/master/service_internal_test.go: TestPartitionCount,
TestPartionIndex), plus byte-range coverage and the reproducible deal order."""

from __future__ import annotations

import itertools
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from master.partition import (
    COMPRESSED_SUFFIXES,
    ChunkRange,
    FileEntry,
    Partition,
    is_compressed,
    task_order,
)

pytestmark = pytest.mark.unit


def part(files, *, chunk_bytes=10, chunks_per_task=1, splits_files=True) -> Partition:
    entries = [f if isinstance(f, FileEntry) else FileEntry(*f) for f in files]
    return Partition(entries, chunk_bytes=chunk_bytes, chunks_per_task=chunks_per_task,
                     splits_files=splits_files)


def n_chunks_by_range(n: int, chunks_per_task: int) -> Partition:
    """n byte-range chunks of one file."""
    return part([("big.txt", n * 7)], chunk_bytes=7, chunks_per_task=chunks_per_task)


# ---- counts, as in the Go master's TestPartitionCount ---------------------------------


@pytest.mark.parametrize("chunks, per_task, tasks", [
    (100, 5, 20),
    (101, 5, 21),
    (101, 1, 101),
    (100, 1, 100),
    (1, 5, 1),
    (5, 5, 1),
    (6, 5, 2),
    (100, 100, 1),
    (100, 1000, 1),
])
def test_task_count_is_chunks_divided_by_chunks_per_task_rounded_up(chunks, per_task, tasks):
    for files in (
        [(f"f{i}.gz", 100) for i in range(chunks)],     # one chunk per compressed file
        [("big.txt", chunks * 7)],                      # byte ranges of one file
    ):
        p = part(files, chunk_bytes=7, chunks_per_task=per_task)
        assert p.num_chunks == chunks
        assert p.num_tasks == tasks
        sizes = [len(p.task_chunks(t)) for t in range(tasks)]
        assert sum(sizes) == chunks
        assert all(s == per_task for s in sizes[:-1])
        assert 1 <= sizes[-1] <= per_task


def test_one_chunk_per_task_gives_a_task_per_chunk_in_order():
    p = n_chunks_by_range(13, chunks_per_task=1)
    assert p.num_tasks == 13
    for t in range(13):
        [c] = p.task_chunks(t)
        assert c == p.chunk(t) == ChunkRange("big.txt", 7 * t, 7 * t + 7)


def test_task_t_owns_chunks_t_times_k_to_t_plus_one_times_k():
    """TestPartionIndex: tasks are numbered 0..T-1 in partition order."""
    p = part([(f"f{i}.gz", 100) for i in range(100)], chunks_per_task=5)
    for t in range(20):
        assert [c.path for c in p.task_chunks(t)] == [f"f{i}.gz" for i in range(5 * t, 5 * t + 5)]


@pytest.mark.parametrize("field, value", [("chunk_bytes", 0), ("chunk_bytes", -1),
                                          ("chunks_per_task", 0), ("chunks_per_task", -3)])
def test_non_positive_chunk_bytes_or_chunks_per_task_is_refused_naming_the_value(field, value):
    kwargs = {"chunk_bytes": 10, "chunks_per_task": 1, field: value}
    with pytest.raises(ValueError, match=f"{field} {value}"):
        Partition([FileEntry("a", 10)], splits_files=True, **kwargs)


def test_no_files_gives_no_chunks_and_no_tasks():
    p = part([])
    assert (p.num_chunks, p.num_tasks) == (0, 0)
    with pytest.raises(IndexError):
        p.chunk(0)
    with pytest.raises(IndexError):
        p.task_chunks(0)


# ---- byte ranges ----------------------------------------------------------------------


@pytest.mark.parametrize("size, chunk_bytes", [
    (10, 3), (9, 3), (1, 64), (64, 64), (65, 64), (127, 64), (128, 64), (1000, 1), (5, 1000),
])
def test_a_file_is_cut_into_ceil_size_over_chunk_ranges_covering_it_exactly(size, chunk_bytes):
    p = part([("data.csv", size)], chunk_bytes=chunk_bytes)
    expected = -(-size // chunk_bytes)
    assert p.num_chunks == expected
    chunks = [p.chunk(i) for i in range(expected)]
    assert chunks[0].begin == 0
    assert chunks[-1].end == size
    for a, b in itertools.pairwise(chunks):
        assert a.end == b.begin, "contiguous, no gap, no overlap"
    for c in chunks:
        assert c.path == "data.csv"
        assert 0 < c.end - c.begin <= chunk_bytes
    assert all(c.end - c.begin == chunk_bytes for c in chunks[:-1])


def test_the_last_range_of_a_file_is_the_short_remainder():
    p = part([("a.txt", 25)], chunk_bytes=10)
    assert [p.chunk(i) for i in range(3)] == [
        ChunkRange("a.txt", 0, 10), ChunkRange("a.txt", 10, 20), ChunkRange("a.txt", 20, 25)]


# ---- whole-file chunks ----------------------------------------------------------------


@pytest.mark.parametrize("suffix", [*COMPRESSED_SUFFIXES, ".GZ", ".Zst", ".tar.gz"])
def test_a_compressed_file_is_one_chunk_whatever_its_size(suffix):
    path = f"s3://bucket/part-0{suffix}"
    assert is_compressed(path)
    p = part([(path, 10_000)], chunk_bytes=10)
    assert p.num_chunks == 1
    assert p.chunk(0) == ChunkRange(path, 0, 10_000)


@pytest.mark.parametrize("path", ["a.txt", "a.gz.txt", "a.gzip", "agz", "a.zstd", "a.csv"])
def test_a_file_that_is_not_compressed_is_split(path):
    assert not is_compressed(path)
    assert part([(path, 30)], chunk_bytes=10).num_chunks == 3


def test_files_that_are_not_split_give_one_chunk_each():
    p = part([("a.png", 1000), ("b.png", 1), ("c.png", 55)], chunk_bytes=10, splits_files=False)
    assert p.num_chunks == 3
    assert [p.chunk(i) for i in range(3)] == [
        ChunkRange("a.png", 0, 1000), ChunkRange("b.png", 0, 1), ChunkRange("c.png", 0, 55)]


def test_split_and_whole_files_mix_in_one_list():
    p = part([("a.txt", 25), ("b.gz", 999), ("c.txt", 10)], chunk_bytes=10)
    assert [p.chunk(i) for i in range(p.num_chunks)] == [
        ChunkRange("a.txt", 0, 10), ChunkRange("a.txt", 10, 20), ChunkRange("a.txt", 20, 25),
        ChunkRange("b.gz", 0, 999), ChunkRange("c.txt", 0, 10)]


# ---- empty files ----------------------------------------------------------------------


@pytest.mark.parametrize("splits_files", [True, False])
@pytest.mark.parametrize("names", [
    ["e0", "a", "b"],              # empty before
    ["a", "e0", "b"],              # empty between
    ["a", "b", "e0"],              # empty after
    ["e0", "e1", "a", "e2", "e3", "b", "e4", "e5"],  # runs of empties everywhere
])
def test_empty_files_give_no_chunk_and_do_not_shift_the_lookup(names, splits_files):
    sizes = {"a": 25, "b": 12}
    files = [(f"{n}.txt", sizes.get(n, 0)) for n in names]
    p = part(files, chunk_bytes=10, splits_files=splits_files)
    got = [p.chunk(i) for i in range(p.num_chunks)]
    if splits_files:
        assert got == [ChunkRange("a.txt", 0, 10), ChunkRange("a.txt", 10, 20),
                       ChunkRange("a.txt", 20, 25), ChunkRange("b.txt", 0, 10),
                       ChunkRange("b.txt", 10, 12)]
    else:
        assert got == [ChunkRange("a.txt", 0, 25), ChunkRange("b.txt", 0, 12)]
    assert not any(c.path.startswith("e") for c in got)
    with pytest.raises(IndexError):
        p.chunk(p.num_chunks)


def test_only_empty_files_give_no_tasks():
    p = part([("a.txt", 0), ("b.gz", 0), ("c.txt", 0)])
    assert (p.num_chunks, p.num_tasks) == (0, 0)


def test_an_empty_compressed_file_gives_no_chunk():
    p = part([("a.gz", 0), ("b.gz", 5)])
    assert [p.chunk(i) for i in range(p.num_chunks)] == [ChunkRange("b.gz", 0, 5)]


# ---- tasks span files -----------------------------------------------------------------


def test_tasks_span_files_when_chunks_per_task_is_more_than_one():
    p = part([("a.txt", 25), ("e.txt", 0), ("b.txt", 15), ("c.gz", 7)],
             chunk_bytes=10, chunks_per_task=4)
    assert p.num_chunks == 6 and p.num_tasks == 2
    assert p.task_chunks(0) == [
        ChunkRange("a.txt", 0, 10), ChunkRange("a.txt", 10, 20), ChunkRange("a.txt", 20, 25),
        ChunkRange("b.txt", 0, 10)]
    assert p.task_chunks(1) == [ChunkRange("b.txt", 10, 15), ChunkRange("c.gz", 0, 7)]


# ---- out of range ---------------------------------------------------------------------


def test_out_of_range_chunk_and_task_indexes_raise_index_error_naming_them():
    p = part([("a.txt", 25)], chunk_bytes=10, chunks_per_task=2)
    assert (p.num_chunks, p.num_tasks) == (3, 2)
    for bad in (-1, 3, 100):
        with pytest.raises(IndexError, match=f"chunk {bad} out of range 0..2"):
            p.chunk(bad)
    for bad in (-1, 2, 100):
        with pytest.raises(IndexError, match=f"task {bad} out of range 0..1"):
            p.task_chunks(bad)


# ---- property: every byte of every file in exactly one chunk of one task --------------


files_strategy = st.lists(
    st.tuples(st.integers(0, 1000), st.sampled_from(["txt", "csv", "gz", "zst"])),
    max_size=8,
)


@settings(max_examples=150, deadline=None, database=None)
@given(files=files_strategy, chunk_bytes=st.integers(1, 300), chunks_per_task=st.integers(1, 7),
       splits_files=st.booleans())
def test_the_tasks_cover_each_file_exactly_once(files, chunk_bytes, chunks_per_task, splits_files):
    entries = [FileEntry(f"f{i}.{ext}", size) for i, (size, ext) in enumerate(files)]
    p = Partition(entries, chunk_bytes=chunk_bytes, chunks_per_task=chunks_per_task,
                  splits_files=splits_files)
    tasks = [p.task_chunks(t) for t in range(p.num_tasks)]
    assert all(1 <= len(t) <= chunks_per_task for t in tasks)
    assert all(len(t) == chunks_per_task for t in tasks[:-1])
    chunks = [c for t in tasks for c in t]
    assert len(chunks) == p.num_chunks
    assert p.num_tasks == -(-p.num_chunks // chunks_per_task)
    by_path: dict[str, list[ChunkRange]] = {}
    for c in chunks:
        by_path.setdefault(c.path, []).append(c)
    for e in entries:
        got = by_path.pop(e.path, [])
        if e.size == 0:
            assert got == []
            continue
        # the chunks of a file come in order, start at 0, touch end to end, stop at size
        assert got[0].begin == 0 and got[-1].end == e.size
        for a, b in itertools.pairwise(got):
            assert a.end == b.begin
        assert all(c.begin < c.end for c in got)
        whole = not splits_files or is_compressed(e.path)
        assert len(got) == (1 if whole else -(-e.size // chunk_bytes))
    assert by_path == {}, "no chunk of an unknown file"
    with pytest.raises(IndexError):
        p.chunk(p.num_chunks)
    with pytest.raises(IndexError):
        p.task_chunks(p.num_tasks)


# ---- the deal order -------------------------------------------------------------------


def test_the_deal_order_is_a_permutation_of_all_tasks():
    for n in (0, 1, 2, 3, 50, 1000, 1023, 1024, 1025, 4097):
        assert sorted(list(task_order(n, seed=3, epoch=1))) == list(range(n))


def test_the_same_seed_and_epoch_give_the_same_order():
    assert list(task_order(50, seed=11, epoch=4)) == list(task_order(50, seed=11, epoch=4))


def test_another_epoch_or_seed_gives_another_order():
    base = list(task_order(50, seed=11, epoch=4))
    assert list(task_order(50, seed=11, epoch=5)) != base
    assert list(task_order(50, seed=12, epoch=4)) != base
    epochs = {tuple(list(task_order(50, seed=0, epoch=e))) for e in range(20)}
    assert len(epochs) == 20


def test_the_deal_order_is_stable_across_processes_and_versions():
    """A restarted master must deal the same order: pinned, so that a change of the
    shuffle (or a seed that depends on PYTHONHASHSEED) cannot slip in unnoticed."""
    assert list(task_order(10, seed=0, epoch=0)) == [0, 9, 6, 3, 4, 8, 7, 2, 5, 1]
    assert list(task_order(10, seed=7, epoch=3)) == [3, 6, 9, 0, 2, 7, 8, 5, 1, 4]


def test_the_deal_order_of_ten_million_tasks_is_lazy():
    """No list of every task: building the order and reading positions anywhere in it
    touches only those positions (a list of 10M ints would take ~400 MB and seconds)."""
    order = task_order(10_000_000, seed=5, epoch=2)
    assert len(order) == 10_000_000
    sample = [order[i] for i in range(0, 10_000_000, 9_973)]
    assert all(0 <= t < 10_000_000 for t in sample)
    assert len(set(sample)) == len(sample)
    assert sys.getsizeof(order) < 1000
    with pytest.raises(IndexError):
        order[10_000_000]
