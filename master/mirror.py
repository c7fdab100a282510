"""The done marks a standby keeps while it waits, so that its election reads none of them.

Without it, a failover late in a big epoch spends most of its load reading the epoch's
done marks (up to one key per task: a million), after the election, while no master
serves. A standby reads them once while it waits (`DoneMarkMirror.start`), then follows every
change to them in one etcd watch; the new leader's first load takes its copy
(`marks`) instead of reading them again.

Why the copy is exact at the first load: the watch's range runs from the done marks to
the leader key (`done/` .. `leader`; between them lie only `epoch`, `failures/` and
`files/`), and etcd sends one watch's events in revision order. Once the mirror has
applied the PUT that created our own leader key, it has applied every change made
before our election. No mark changes between that PUT and our first load: an earlier
leader's writes are fenced by its leader key, deleted before ours was created, and we
write none before we have loaded. A mirror not caught up in time, or broken (a watch
error, a key of another shape, marks outside the current epoch), answers None and the
load reads the marks from etcd as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import aetcd

from master.snapshot import count_keys, read_done_marks
from paddlecloud.aio import cancel_and_wait
from paddlecloud.etcd import read_range
from paddlecloud.keys import JobKeys, prefix_range_end

logger = logging.getLogger(__name__)

CATCH_UP = 2.0                # seconds the first load waits for the mirror to reach the election
RETRY_FIRST, RETRY_MAX = 1.0, 30.0   # seconds before a broken mirror reads the marks again


class DoneMarkMirror:
    """The job's done marks by epoch, as of `revision` (the last change applied)."""

    def __init__(self, client: aetcd.Client, keys: JobKeys) -> None:
        self._client = client
        self._keys = keys
        self._done = keys.kind_prefix("done")
        self._marks: dict[int, set[int]] = {}
        self.revision = 0          # 0 until the marks are read and the watch follows them
        self._moved = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name="done-mark-mirror")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        self._marks.clear()
        self.revision = 0

    async def marks(self, epoch: int, *, revision: int, timeout: float = CATCH_UP) -> list[int] | None:
        """`epoch`'s done marks once every change up to `revision` is applied; None when the
        mirror is not following yet, or does not get there within `timeout` seconds."""
        if self.revision == 0:
            return None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self.revision < revision:
                    self._moved.clear()
                    await self._moved.wait()
        if self.revision < revision:
            return None
        return list(self._marks.get(epoch, ()))

    async def _follow(self) -> None:
        wait = RETRY_FIRST
        while True:
            try:
                await self._read_and_watch()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the load reads from etcd meanwhile: never fatal
                logger.info("done-mark mirror stopped (%s: %s); reading again in %.0f s",
                            type(error).__name__, error, wait)
            if self.revision:  # it had followed: the next failure is a new one
                wait = RETRY_FIRST
            self._marks.clear()
            self.revision = 0
            self._moved.set()
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETRY_MAX)

    async def _read_and_watch(self) -> None:
        began = time.monotonic()
        epoch_kvs, start = await read_range(self._client, self._keys.epoch, self._keys.epoch + b"\0")
        self._marks.clear()
        if epoch_kvs:
            epoch = int(epoch_kvs[0].value)
            done = await read_done_marks(self._client, self._keys, epoch, start)
            total = await count_keys(self._client, self._done, prefix_range_end(self._done),
                                     revision=start)
            if total != len(done):
                raise ValueError(f"{total - len(done)} done marks outside epoch {epoch}")
            self._marks[epoch] = set(done)
        watch = await self._client.watch(self._done, range_end=self._keys.leader + b"\0",
                                         start_revision=start + 1)
        self.revision = start
        self._moved.set()
        logger.info("done-mark mirror following from revision %d: %d marks read in %.2f s", start,
                    sum(map(len, self._marks.values())), time.monotonic() - began)
        try:
            async for event in watch:
                self._apply(event.kind, event.kv.key, event.kv.mod_revision)
        finally:
            with contextlib.suppress(Exception):
                await watch.cancel()
        raise ConnectionError("the watch ended")

    def _apply(self, kind: str, key: bytes, revision: int) -> None:
        if key.startswith(self._done):
            epoch, _, task = key[len(self._done):].partition(b"/")
            marks = self._marks.setdefault(int(epoch), set())
            if kind == "PUT":
                marks.add(int(task))
            else:
                marks.discard(int(task))
        self.revision = revision
        self._moved.set()
