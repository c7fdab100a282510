"""The snapshot load: what etcd holds of one job, read at one revision, that the master's
machine is rebuilt from (`master.machine.Loaded`).

Everything but the done marks comes from two ranges read at one revision. The done
marks (up to one per task: a failover late in a big epoch finds a million) come from a
standby's mirror where it has them as of the election (`master.mirror`), else are read
apart, in many small ranges at once: etcd 3.4 walks the whole rest of a range for each
page it answers, so one paged range over them costs O(marks^2).

What this does NOT do: decide what the keys mean for the job (the machine's `apply`
does), or write anything.
"""

from __future__ import annotations

import asyncio
import json
from typing import Protocol

import aetcd
from aetcd import rpc

from master.config import DatasetSpec
from master.machine import Snapshot
from master.partition import FileEntry
from master.state import Assignment
from master.store_errors import etcd_answers
from paddlecloud.elastic import TrainerRange
from paddlecloud.etcd import Leadership, read_key_numbers, read_range
from paddlecloud.keys import JobKeys, prefix_range_end
from paddlecloud.phase import Phase

DONE_RANGE = 10_000  # done marks per range the load reads them in (about)


class MarkMirror(Protocol):
    """A copy of the done marks kept outside the load (`master.mirror.DoneMarkMirror`)."""

    async def marks(self, epoch: int, *, revision: int) -> list[int] | None:
        """`epoch`'s marks with every change up to `revision` applied; None if not known."""


async def count_keys(client: aetcd.Client, key: bytes, range_end: bytes, *, revision: int) -> int:
    """How many keys [key, range_end) holds at `revision` (etcd counts them in its index)."""
    await client.connect()
    counted = await client.kvstub.Range(
        rpc.RangeRequest(key=key, range_end=range_end, revision=revision, count_only=True),
        timeout=30, metadata=client.metadata)
    return counted.count


async def read_done_marks(client: aetcd.Client, keys: JobKeys, epoch: int, revision: int) -> list[int]:
    """The tasks marked done in `epoch` at `revision`: keys only, in ranges of about
    DONE_RANGE marks each (by the leading digits of the task id), a few at once, each
    decoded without an object per key (`read_key_numbers`)."""
    base = keys.kind_prefix("done") + b"%d/" % epoch
    count = await count_keys(client, base, prefix_range_end(base), revision=revision)
    digits = len(str(max(1, count // DONE_RANGE - 1)))
    if count <= DONE_RANGE:
        ranges = [(base, prefix_range_end(base))]
    else:
        # ids shorter than `digits` are single keys; the others share their first `digits` digits
        ranges = [(key, key + b"\0") for width in range(1, digits)
                  for key in (base + b"%0*d" % (width, i) for i in range(10 ** width))]
        ranges += [(key, prefix_range_end(key))
                   for key in (base + b"%0*d" % (digits, i) for i in range(10 ** digits))]
    gate = asyncio.Semaphore(16)

    async def read(lo: bytes, hi: bytes) -> list[int]:
        async with gate:
            return await read_key_numbers(client, base, lo, hi, revision=revision)

    done: list[int] = []
    for part in await asyncio.gather(*(read(lo, hi) for lo, hi in ranges)):
        done.extend(part)
    return done


async def load(client: aetcd.Client, keys: JobKeys, leadership: Leadership,
               mirror: MarkMirror | None = None) -> Snapshot:
    """The job's keys at one revision; the done marks from `mirror` where it has them
    (see the module docstring)."""
    prefix = keys.prefix
    with etcd_answers("the job's keys"):
        head, revision = await read_range(client, prefix, prefix + b"done/")
        tail, _ = await read_range(client, prefix + b"done0", prefix_range_end(prefix),
                                   revision=revision)
    snap = Snapshot(revision=revision)
    plen = len(prefix)
    pieces: list[tuple[bytes, bytes]] = []
    restart: dict | None = None
    extents: list[tuple[int, int, tuple[int, int, int]]] = []  # (epoch, unit, its cut: work stealing)
    marks: list = []  # failures keys: up to one per task, read below without decoding
    epoch_revision = phase_revision = 0  # the keys' mod revisions (0: absent)
    for kv in (*head, *tail):
        if kv.key.startswith(b"failures/", plen):
            marks.append(kv)
            continue
        parts = kv.key[plen:].decode().split("/")
        kind = parts[0]
        if kind == "spec":
            snap.spec = DatasetSpec.from_json(kv.value)
        elif kind == "files":
            pieces.append((kv.key, kv.value))
        elif kind == "epoch":
            snap.epoch = int(kv.value)
            epoch_revision = kv.mod_revision
        elif kind == "phase":
            snap.phase = Phase(kv.value.decode())
            phase_revision = kv.mod_revision
        elif kind == "trainers":
            snap.trainers["/".join(parts[1:])] = int(kv.value)
        elif kind == "superseded":
            snap.superseded[int(parts[1])] = kv.value.decode()
        elif kind == "assign":
            raw = json.loads(kv.value)
            snap.assignments[int(parts[1])] = Assignment(
                session=raw["session"], trainer=raw["trainer"],
                attempt=kv.mod_revision, deadline=raw["deadline"])
        elif kind == "pservers":
            snap.pservers[int(parts[1])] = kv.value.decode()
        elif kind == "restart":
            restart = json.loads(kv.value)
        elif kind == "extents":
            raw = json.loads(kv.value)
            extents.append((int(parts[1]), int(parts[2]), (raw["task"], raw["lo"], raw["hi"])))
        elif kind == "trainers-range":
            snap.trainer_range = TrainerRange.from_json(kv.value)
        elif kind == "trainers-desired":
            snap.trainers_desired = int(kv.value)
        elif kind == "save-model":
            snap.save_model = kv.value.decode()
    if snap.phase is Phase.SUCCEEDED and phase_revision == epoch_revision:
        # Written in the data's end's own transaction, as older masters did: the data's end,
        # not a deployer's verdict (a verdict is a write of its own); trainers may still run.
        snap.phase = None
    for _, value in sorted(pieces):
        snap.files.extend(FileEntry(p, s) for p, s in json.loads(value))
    snap.extents = {unit: extent for epoch, unit, extent in extents if epoch == snap.epoch}
    if snap.epoch is not None:
        failures = prefix + b"failures/%d/" % snap.epoch
        flen = len(failures)
        for kv in marks:
            if kv.key.startswith(failures):
                task = int(kv.key[flen:])
                snap.failures[task] = int(kv.value)
                snap.failed_at[task] = kv.mod_revision  # where it queues (master.partition.DealQueue)
        mirrored = None if mirror is None else await mirror.marks(
            snap.epoch, revision=leadership.create_revision)
        snap.mirrored = mirrored is not None
        if mirrored is not None:
            snap.done = mirrored
        else:
            with etcd_answers("the done marks"):
                snap.done = await read_done_marks(client, keys, snap.epoch, revision)
        if restart is not None and restart["epoch"] == snap.epoch:
            # a bigger restart whose marks were not all written: its list is the truth
            snap.done = sorted(set(snap.done) | {int(t) for t in restart["done"]})
    return snap
