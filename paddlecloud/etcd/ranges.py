"""Reading a range of many keys at one revision, in pages (etcd answers one Range with one
message, and a job's range can hold a million keys): `read_range` gives the key-values,
`read_key_numbers` only the numbers the keys end with, without an object per key."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import aetcd
from aetcd import rpc

READ_PAGE = 5000  # key-values per Range request of `read_range`


async def _range_pages(client: aetcd.Client, key: bytes, range_end: bytes, *, revision: int,
                       keys_only: bool) -> AsyncIterator[tuple[rpc.RangeResponse, bytes]]:
    """Each page of [key, range_end) at one revision (`revision`, else the first page's),
    parsed and as the bytes etcd sent (for `read_key_numbers`)."""
    await client.connect()
    raw_range = client.channel.unary_unary("/etcdserverpb.KV/Range",
                                           request_serializer=rpc.RangeRequest.SerializeToString,
                                           response_deserializer=None)  # the bytes as sent
    start = key
    while True:
        raw = await raw_range(rpc.RangeRequest(key=start, range_end=range_end, limit=READ_PAGE,
                                               revision=revision, keys_only=keys_only),
                              timeout=30, metadata=client.metadata)
        reply = rpc.RangeResponse.FromString(raw)
        revision = revision or reply.header.revision
        yield reply, raw
        if not reply.more or not reply.kvs:
            return
        start = reply.kvs[-1].key + b"\0"


async def read_range(client: aetcd.Client, key: bytes, range_end: bytes, *,
                     revision: int = 0, keys_only: bool = False) -> tuple[list, int]:
    """All key-values in [key, range_end) at one revision, read in pages; returns (kvs, revision)."""
    kvs: list = []
    async for reply, _ in _range_pages(client, key, range_end, revision=revision, keys_only=keys_only):
        revision = revision or reply.header.revision
        kvs.extend(reply.kvs)
    return kvs, revision


async def read_key_numbers(client: aetcd.Client, base: bytes, key: bytes, range_end: bytes, *,
                           revision: int) -> list[int]:
    """The numbers N of the keys `base` + N (decimal) in [key, range_end) at `revision`.

    For ranges of many keys (a late epoch's done marks: up to one per task, a million):
    a Python object per key-value costs a microsecond or more, a third of it gone here.
    Each page is read keys only, as the bytes etcd sent, and its keys found in them by one
    regex (C speed): in a keys-only answer `base` occurs only inside keys, and a key is
    followed by the tag of `create_revision` (field 2, always set), never by a digit. A
    page whose matches and keys do not count the same (a key of another shape) is read
    key by key instead, and a key that is not `base` + digits is a ValueError naming it.
    """
    pattern = re.compile(re.escape(base) + rb"(\d+)(?=\x10)")
    numbers: list[int] = []
    async for reply, raw in _range_pages(client, key, range_end, revision=revision, keys_only=True):
        found = pattern.findall(raw)
        if len(found) == len(reply.kvs):
            numbers.extend(map(int, found))
        else:
            numbers.extend(_key_number(kv.key, base) for kv in reply.kvs)
    return numbers


def _key_number(key: bytes, base: bytes) -> int:
    suffix = key[len(base):]
    if not key.startswith(base) or not suffix.isdigit():
        raise ValueError(f"etcd key {key[:80]!r} is not {base[:60]!r} and a number")
    return int(suffix)
