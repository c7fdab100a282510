"""A job's history of per-task marks, read back from etcd: how tests, the chaos audit and
the benchmarks prove "counted exactly once per epoch" from etcd itself.

etcd keeps every revision until compaction, so a watch from an early revision replays
every PUT and DELETE of the `done/<epoch>/<task>` (or `failures/...`) keys in order. A
marker put inside the watched range ends the replay: everything before it is history.

What this does NOT do: read history older than etcd's last compaction (the watch fails
with a compaction error then).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from paddlecloud import etcd
from paddlecloud.keys import JobKeys, prefix_range_end


@dataclass(frozen=True)
class MarkEvent:
    kind: str      # "PUT" or "DELETE"
    epoch: int
    task: int
    value: bytes   # the mark's value (the failure count, for `failures`)


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
