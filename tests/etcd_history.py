"""A job's history of per-task marks, read back from etcd: how the tests, the chaos audit
(tests/chaos/harness.py) and the benchmarks (bench/faults.py, bench/scale.py) prove "counted
exactly once per epoch" from etcd itself. The tests import it as `etcd_history`, the chaos
harness and the benchmarks as `tests.etcd_history` (the checkout on sys.path).

etcd keeps every revision until compaction, so a watch from an early revision replays
every PUT and DELETE of the `done/<epoch>/<task>` (or `failures/...`) keys in order. A
marker put inside the watched range ends the replay: everything before it is history.
`audit_done_marks` does the arithmetic on that history, once for all its readers.

What this does NOT do: read history older than etcd's last compaction (the watch fails
with a compaction error then), or judge anything but the marks (whether every record
was read is the trainers' logs' to say).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from paddlecloud import etcd
from paddlecloud.keys import JobKeys, prefix_range_end


@dataclass(frozen=True)
class MarkEvent:
    kind: str      # "PUT" or "DELETE"
    epoch: int
    task: int
    value: bytes = b""  # the mark's value (the failure count, for `failures`)


async def mark_history(endpoint: str, keys: JobKeys, kind: str = "done", *,
                       start_revision: int = 1, timeout: float = 60.0) -> list[MarkEvent]:
    """Every PUT/DELETE of the job's `<kind>/<epoch>/<task>` keys from `start_revision`, in order."""
    prefix = keys.kind_prefix(kind)
    marker = prefix + b"~history-marker"  # sorts after every `<epoch>/` inside the range
    client = await etcd.connect(endpoint)
    events: list[MarkEvent] = []
    try:
        await client.put(marker, b"")
        watch = await client.watch(prefix, range_end=prefix_range_end(prefix),
                                   start_revision=start_revision)
        try:
            async def replay() -> None:
                async for event in watch:
                    if event.kv.key == marker:
                        return
                    epoch, task = event.kv.key[len(prefix):].decode().split("/")
                    events.append(MarkEvent(event.kind, int(epoch), int(task), event.kv.value))
            await asyncio.wait_for(replay(), timeout)
        finally:
            await watch.cancel()
            await client.delete(marker)
    finally:
        await client.close()
    return events


@dataclass(frozen=True)
class MarkAudit:
    """What a job's done marks say about "every task counted exactly once per epoch"."""

    double_counted: tuple[tuple[int, int], ...]  # (epoch, task) marked done while its mark lived
    passes: dict[int, frozenset[int]]            # epoch -> the tasks its last pass counted done
    lost: dict[int, frozenset[int]]              # epoch -> tasks its last pass neither did nor failed

    @property
    def lost_count(self) -> int:
        return sum(len(tasks) for tasks in self.lost.values())


def audit_done_marks(done: Iterable[MarkEvent], *, epochs: int, tasks: int | None = None,
                     failed: Iterable[tuple[int, int]] = (), pieces: Iterable[int] = ()) -> MarkAudit:
    """Replays the done marks of epochs `0..epochs-1` in order.

    A PUT of a mark that is still there counts the task twice. When an epoch's last mark
    is deleted (its end, or a RestartEpoch) and its pass did not cover every task, the
    pass was restarted unfinished and does not count: the next pass must. `tasks` is the
    number of tasks per epoch (default: every task seen marked or failed, but `pieces`);
    `failed` are the (epoch, task) pairs that ended the epoch failed, which a pass need
    not count. `pieces` (`piece_ids`) are the units work stealing split off a task: one
    pass has them, the next may not (a pass is complete when every task is done, a split
    task by its own mark), so they are no task a pass must count.
    """
    done = list(done)
    failed_in: dict[int, set[int]] = {}
    for epoch, task in failed:
        failed_in.setdefault(epoch, set()).add(task)
    every = (set(range(tasks)) if tasks is not None
             else ({m.task for m in done} | {t for ts in failed_in.values() for t in ts}) - set(pieces))
    live: dict[int, set[int]] = {}
    passes: dict[int, set[int]] = {}
    double: list[tuple[int, int]] = []
    for mark in done:
        marked = live.setdefault(mark.epoch, set())
        if mark.kind == "PUT":
            if mark.task in marked:
                double.append((mark.epoch, mark.task))
            marked.add(mark.task)
            passes.setdefault(mark.epoch, set()).add(mark.task)
        else:
            marked.discard(mark.task)
            if not marked and not every <= passes.get(mark.epoch, set()) | failed_in.get(mark.epoch, set()):
                passes.pop(mark.epoch, None)  # a restarted, unfinished pass
    lost = {epoch: frozenset(every - passes.get(epoch, set()) - failed_in.get(epoch, set()))
            for epoch in range(epochs)}
    return MarkAudit(double_counted=tuple(double),
                     passes={epoch: frozenset(ts) for epoch, ts in sorted(passes.items())},
                     lost={epoch: ts for epoch, ts in lost.items() if ts})


async def done_events(endpoint: str, keys: JobKeys) -> list[tuple[str, int, int]]:
    """Every PUT/DELETE of a `done/<epoch>/<task>` key over the whole history, in order."""
    return [(e.kind, e.epoch, e.task) for e in await mark_history(endpoint, keys, "done")]


async def piece_ids(endpoint: str, keys: JobKeys) -> frozenset[int]:
    """The units work stealing split off a task, over the whole history: an `extents/<epoch>/<unit>`
    whose root task is another unit (a split task's own extent names itself)."""
    return frozenset(e.task for e in await mark_history(endpoint, keys, "extents")
                     if e.kind == "PUT" and json.loads(e.value)["task"] != e.task)


async def done_marks(endpoint: str, keys: JobKeys) -> Counter:
    """How many times each `done/<epoch>/<task>` key was created, over the whole history."""
    return Counter(f"{epoch}/{task}" for kind, epoch, task in await done_events(endpoint, keys)
                   if kind == "PUT")


def per_epoch(counts: Counter) -> dict[int, Counter]:
    """{epoch: Counter(task -> times counted)} from `done_marks`."""
    epochs: dict[int, Counter] = {}
    for key, n in counts.items():
        epoch, task = key.split("/")
        epochs.setdefault(int(epoch), Counter())[int(task)] += n
    return epochs


def check_exactly_once(events: list[tuple[str, int, int]], *, num_tasks: int, num_epochs: int,
                       pieces: frozenset[int] = frozenset()) -> None:
    """No done mark is created twice without being cleared in between (an epoch's end or a
    RestartEpoch clears them), and every epoch's last pass counted every task (`pieces`,
    work stealing's, aside: `audit_done_marks`)."""
    audit = audit_done_marks([MarkEvent(*event) for event in events], epochs=num_epochs, tasks=num_tasks,
                             pieces=pieces)
    assert not audit.double_counted, f"(epoch, task) counted twice: {audit.double_counted}"
    assert sorted(audit.passes) == list(range(num_epochs)), f"epochs completed: {sorted(audit.passes)}"
    for epoch, tasks in audit.passes.items():
        tasks = tasks - pieces
        assert tasks == set(range(num_tasks)), f"epoch {epoch} lost tasks {set(range(num_tasks)) - tasks}"


def check_job_exactly_once(endpoint: str, keys: JobKeys, *, num_epochs: int,
                           num_tasks: int | None = None) -> None:
    """`check_exactly_once` on the job's history in etcd; `num_tasks` defaults to every task
    marked done in it (work stealing's pieces aside)."""
    async def read() -> tuple[list[tuple[str, int, int]], frozenset[int]]:
        return await done_events(endpoint, keys), await piece_ids(endpoint, keys)

    events, pieces = asyncio.run(read())
    if num_tasks is None:
        num_tasks = len({task for _, _, task in events} - pieces)
    check_exactly_once(events, num_tasks=num_tasks, num_epochs=num_epochs, pieces=pieces)
