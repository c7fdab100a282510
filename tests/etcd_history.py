"""Reads a job's etcd history back, to check what was counted and how often."""

from __future__ import annotations

import asyncio
from collections import Counter

import aetcd

from paddlecloud import etcd
from paddlecloud.keys import JobKeys, prefix_range_end


async def done_marks(endpoint: str, keys: JobKeys) -> Counter:
    """How many times each `done/<epoch>/<task>` key was created, over the whole history."""
    client = await etcd.connect(endpoint)
    try:
        return await _count_creations(client, keys.kind_prefix("done"))
    finally:
        await client.close()


async def _count_creations(client: aetcd.Client, prefix: bytes) -> Counter:
    # A put inside the watched range marks "now": every event before it is history.
    marker = prefix + b"~history-marker"
    put = await client.put(marker, b"")
    last = put.header.revision
    counts: Counter = Counter()
    watch = await client.watch(prefix, range_end=prefix_range_end(prefix), start_revision=1)
    try:
        async def drain() -> None:
            async for event in watch:
                if event.kv.key == marker:
                    return
                if event.kind == "PUT" and event.kv.version == 1:
                    counts[event.kv.key.decode().rsplit("/done/", 1)[1]] += 1
                if event.kv.mod_revision >= last:
                    return
        await asyncio.wait_for(drain(), 60)
    finally:
        await watch.cancel()
        await client.delete(marker)
    return counts


def per_epoch(counts: Counter) -> dict[int, Counter]:
    """{epoch: Counter(task -> times counted)} from `done_marks`."""
    epochs: dict[int, Counter] = {}
    for key, n in counts.items():
        epoch, task = key.split("/")
        epochs.setdefault(int(epoch), Counter())[int(task)] += n
    return epochs
