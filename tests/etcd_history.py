"""Reads a job's etcd history back, to check what was counted and how often."""

from __future__ import annotations

from collections import Counter

from paddlecloud.history import MarkEvent, audit_done_marks, mark_history
from paddlecloud.keys import JobKeys


async def done_events(endpoint: str, keys: JobKeys) -> list[tuple[str, int, int]]:
    """Every PUT/DELETE of a `done/<epoch>/<task>` key over the whole history, in order."""
    return [(e.kind, e.epoch, e.task) for e in await mark_history(endpoint, keys, "done")]


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


def check_exactly_once(events: list[tuple[str, int, int]], *, num_tasks: int, num_epochs: int) -> None:
    """No done mark is created twice without being cleared in between (an epoch's end or a
    RestartEpoch clears them), and every epoch's last pass counted every task."""
    audit = audit_done_marks([MarkEvent(*event) for event in events], epochs=num_epochs, tasks=num_tasks)
    assert not audit.double_counted, f"(epoch, task) counted twice: {audit.double_counted}"
    assert sorted(audit.passes) == list(range(num_epochs)), f"epochs completed: {sorted(audit.passes)}"
    for epoch, tasks in audit.passes.items():
        assert tasks == set(range(num_tasks)), f"epoch {epoch} lost tasks {set(range(num_tasks)) - tasks}"
