"""Lease refreshes in a process of their own, so a busy event loop cannot starve them.

grpc.aio moves a stream about one message per turn of the event loop. A master busy with
thousands of trainers turns its loop slowly, so its one LeaseKeepAlive stream fell behind
and sessions lapsed although their trainers called. A child process on an idle loop
keeps up however busy the master is (`bench/lease_keeper.py` measures both keepers side
by side; docs/benchmarks.md, "Lease keeper"). A lease refresh writes no job state, so
the single writer stays single.

`LeaseKeeperProcess` is a `LeaseKeeper` whose "stream" is the child's pipes: lease ids go
down as 8-byte integers, (lease, TTL) answers come back as two, each side writing
whatever one turn of its loop gathered in one write. The child (`python -m
paddlecloud.lease_process`) reads its connection settings from the first line of its
stdin (so a password never shows on a command line; `probe`, the key its login is proved
on: the job's prefix, where a job's own etcd user may read), then refreshes every id it reads
over its own `LeaseKeeper` (which reopens etcd's stream when etcd ends it). It exits when
its stdin closes: its parent stopped, or died.

A child that dies is started again and asked again for every lease not yet answered, as
a broken etcd stream is (`LeaseKeeper._run`).

What this does NOT do: share one child between masters, or carry anything but refreshes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import signal
import struct
import subprocess
import sys
from collections.abc import AsyncIterator

from paddlecloud.aio import cancel_and_wait
from paddlecloud.etcd import RPC_TIMEOUT, EtcdCredentials, EtcdUnavailable, LeaseKeeper, connect

logger = logging.getLogger(__name__)

_ID = struct.Struct("<q")         # a lease id, parent -> child
_ANSWER = struct.Struct("<qq")    # (lease id, remaining TTL), child -> parent
_READ = 1 << 16
STOP_WAIT = 5.0  # seconds a child has to exit once its stdin closed, before it is killed


class LeaseKeeperProcess(LeaseKeeper):
    def __init__(self, endpoints: str, *, credentials: EtcdCredentials | None = None,
                 timeout: float = RPC_TIMEOUT, probe: bytes = b"/paddlecloud/") -> None:
        super().__init__(None)
        self.child: subprocess.Popen | None = None  # the one running now
        self._settings = {"endpoints": endpoints, "timeout": timeout, "probe": probe.decode(),
                          "credentials": dataclasses.asdict(credentials or EtcdCredentials.from_env())}

    async def _stream(self, queue: asyncio.Queue[int]) -> None:
        """Runs one child until it exits."""
        loop = asyncio.get_running_loop()
        child = self.child = await asyncio.to_thread(_spawn)
        answers = asyncio.StreamReader(limit=_READ * 4)
        reading, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(answers),
                                                  child.stdout)
        writing, _ = await loop.connect_write_pipe(asyncio.Protocol, child.stdin)
        writing.write(json.dumps(self._settings).encode() + b"\n")
        sender = asyncio.create_task(_send(queue, writing), name="lease-process-send")
        try:
            async for lease, ttl in _records(answers, _ANSWER):
                self._answered(lease, ttl)
        finally:
            await cancel_and_wait(sender)
            writing.close()  # the child exits at the end of its stdin
            reading.close()
            await _reap(child)
        raise EtcdUnavailable(f"the lease keeper process exited with code {child.returncode}")


async def _records(pipe: asyncio.StreamReader, record: struct.Struct) -> AsyncIterator[tuple]:
    """The fixed-size records on `pipe` until its end, as they come (a read may split one)."""
    rest = b""
    while chunk := await pipe.read(_READ):
        rest += chunk
        whole = len(rest) - len(rest) % record.size
        for fields in record.iter_unpack(rest[:whole]):
            yield fields
        rest = rest[whole:]


def _spawn() -> subprocess.Popen:
    # close_fds=False lets Python start it with posix_spawn, not fork (uvloop's own spawn
    # forks, and gRPC's fork handlers log a line each time); every descriptor Python and
    # gRPC open is close-on-exec already.
    return subprocess.Popen([sys.executable, "-m", "paddlecloud.lease_process"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=False)


async def _send(queue: asyncio.Queue[int], pipe: asyncio.WriteTransport) -> None:
    """Writes the queued lease ids to the child, all that one turn gathered in one write."""
    while True:
        ids = [await queue.get()]
        while not queue.empty():
            ids.append(queue.get_nowait())
        pipe.write(b"".join(_ID.pack(lease) for lease in ids))


async def _reap(child: subprocess.Popen) -> None:
    try:
        await asyncio.to_thread(child.wait, STOP_WAIT)
    except subprocess.TimeoutExpired:
        child.kill()
        await asyncio.to_thread(child.wait)


# ---- the child -------------------------------------------------------------------------


async def _child() -> None:
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader(limit=_READ * 4)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin.buffer)
    settings = json.loads(await stdin.readline())
    client = await connect(settings["endpoints"], timeout=settings["timeout"],
                           credentials=EtcdCredentials(**settings["credentials"]),
                           probe=settings.get("probe", "/paddlecloud/").encode())
    transport, _ = await loop.connect_write_pipe(asyncio.Protocol, sys.stdout.buffer)
    answers = bytearray()

    def flush() -> None:
        transport.write(bytes(answers))
        answers.clear()

    def on_answer(lease: int, ttl: int) -> None:
        if not answers:
            loop.call_soon(flush)  # once per turn: every answer the turn gathered
        answers.extend(_ANSWER.pack(lease, ttl))

    keeper = LeaseKeeper(client, on_answer=on_answer)
    try:
        async for (lease,) in _records(stdin, _ID):
            keeper.refresh_soon(lease)
    finally:
        await keeper.close()
        await client.close()


def main() -> int:
    # A Ctrl-C, or a supervisor's SIGTERM to the whole process group (the local backend's at
    # a job's end), reaches this too: the parent decides when this ends, by closing stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s (lease process): %(message)s")
    from paddlecloud import aio

    try:
        aio.run(_child())
    except EtcdUnavailable as error:
        logger.error("%s", error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
