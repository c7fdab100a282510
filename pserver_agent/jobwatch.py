"""Noticing that a job is over, from etcd: its `phase`, or its `epoch` against the spec.

A job is done when its `phase` key says `Succeeded` or `Failed`, or when its `epoch`
key is at least the `num_epochs` of the dataset spec the master froze in `spec`
(JSON; 0 there means the default, 1). Each of the three keys is read, then watched
from the revision after the read, so no change between the read and the watch is
missed.

Once the job is done, `wait_until_trainers_left` lets the pserver serve its trainers' last
calls (an evaluation, a save, `stop_worker`) before the agent stops it.

What this does NOT guarantee: that a job is ever seen done while etcd is unreachable
(the watcher re-reads and re-watches, with a pause, after every etcd error, and runs
until it sees the end or its caller cancels it), nor that a phase written and then
removed (`paddlecloud job delete`) is seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass

import aetcd

from paddlecloud.aio import cancel_and_wait
from paddlecloud.keys import JobKeys, prefix_range_end
from paddlecloud.phase import Phase

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobProgress:
    """What etcd says of a job's end: its phase, its epoch, the spec's number of epochs."""

    phase: str | None = None
    epoch: int | None = None
    num_epochs: int | None = None

    def done_reason(self) -> str | None:
        """Why the job is done (for the log), or None while it is not."""
        if self.phase in {p.value for p in Phase if p.terminal}:
            return f"phase {self.phase}"
        if self.epoch is not None and self.num_epochs is not None and self.epoch >= self.num_epochs:
            return f"epoch {self.epoch} >= num_epochs {self.num_epochs}"
        return None


def _progress(values: dict[str, bytes | None]) -> JobProgress:
    phase = values.get("phase")
    epoch = values.get("epoch")
    spec = values.get("spec")
    num_epochs = None
    if spec:
        try:
            num_epochs = int(json.loads(spec).get("num_epochs") or 1)
        except (ValueError, TypeError, AttributeError):
            logger.warning("the job's spec is not JSON with num_epochs: %r", spec[:80])
    try:
        epoch_number = int(epoch) if epoch else None
    except ValueError:
        logger.warning("the job's epoch is not a number: %r", epoch[:40])
        epoch_number = None
    return JobProgress(phase=phase.decode() if phase else None, epoch=epoch_number,
                       num_epochs=num_epochs)


async def job_done_reason(client: aetcd.Client, keys: JobKeys) -> str | None:
    """Why the job is done now (one read of its keys), or None while it is not."""
    values = {}
    for key, name in ((keys.phase, "phase"), (keys.epoch, "epoch"), (keys.spec, "spec")):
        current = await client.get(key)
        values[name] = current.value if current is not None else None
    return _progress(values).done_reason()


async def wait_until_job_done(client: aetcd.Client, keys: JobKeys, *, retry_delay: float = 1.0) -> str:
    """Runs until the job is done and returns why; rides out etcd errors. Cancel to stop it."""
    while True:
        try:
            return await _watch_until_done(client, keys)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # etcd down or the watch broke: read again after a pause
            logger.warning("watching the job's phase failed (%s: %s); retrying in %gs",
                           type(error).__name__, error, retry_delay)
            await asyncio.sleep(retry_delay)


async def _watch_until_done(client: aetcd.Client, keys: JobKeys) -> str:
    names = {keys.phase: "phase", keys.epoch: "epoch", keys.spec: "spec"}
    values: dict[str, bytes | None] = {}
    events: asyncio.Queue[tuple[str, bytes | None] | BaseException] = asyncio.Queue()
    watches = []
    pumps: list[asyncio.Task[None]] = []
    try:
        for key, name in names.items():
            reply = await client.get_range(key, key + b"\0")
            values[name] = reply.kvs[0].value if reply.kvs else None
            watches.append((name, await client.watch(key, start_revision=reply.header.revision + 1)))
        reason = _progress(values).done_reason()
        if reason is not None:
            return reason
        for name, watch in watches:
            pumps.append(asyncio.create_task(_pump(name, watch, events), name=f"job-watch-{name}"))
        while True:
            item = await events.get()
            if isinstance(item, BaseException):
                raise item
            name, value = item
            values[name] = value
            reason = _progress(values).done_reason()
            if reason is not None:
                return reason
    finally:
        await cancel_and_wait(*pumps)
        for _, watch in watches:
            with contextlib.suppress(Exception):
                await asyncio.shield(watch.cancel())


async def trainers_alive(client: aetcd.Client, keys: JobKeys) -> int:
    """How many trainers hold a session now (their `trainers/<id>` keys, on the sessions' leases)."""
    prefix = keys.kind_prefix("trainers")
    reply = await client.get_range(prefix, prefix_range_end(prefix))
    return len(reply.kvs)


async def wait_until_trainers_left(client: aetcd.Client, keys: JobKeys, *, poll: float = 0.2) -> None:
    """Returns once no trainer holds a session: the job's data may be done while its trainers
    still evaluate, save or flush through the pservers (a fleet PS trainer's `stop_worker`), so a
    pserver outlives them. A trainer that died keeps its key until its session's TTL lapses.
    Rides out etcd errors; cancel (or bound) it to stop waiting."""
    while True:
        try:
            if await trainers_alive(client, keys) == 0:
                return
        except asyncio.CancelledError:
            raise
        except Exception as error:  # etcd down: look again
            logger.warning("counting the job's trainers failed (%s: %s)", type(error).__name__, error)
        await asyncio.sleep(poll)


async def _pump(name: str, watch, events: asyncio.Queue) -> None:
    try:
        async for event in watch:
            events.put_nowait((name, event.kv.value if event.kind == "PUT" else None))
        events.put_nowait(ConnectionError(f"the etcd watch of the job's {name} ended"))
    except asyncio.CancelledError:
        raise
    except Exception as error:
        events.put_nowait(error)
