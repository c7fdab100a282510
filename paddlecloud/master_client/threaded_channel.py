"""grpc.aio's channel interface over gRPC's synchronous stack: the asyncio client in a process that forks.

A Paddle DataLoader forks its workers, and grpc.aio does not survive a fork: its poller
thread is gone in the child while its state says it runs, so the child's first call waits
for ever (gRPC's fork support, which would reset that state, crashes such children instead).
gRPC's synchronous stack starts its threads per channel and works in a forked child. So the
trainer's library (`trainer_agent.client`) runs the one asyncio client, `MasterConnection`,
over this channel: no grpc.aio in a trainer, whatever its loader does.

How: a unary call is the synchronous multicallable's `future()`, its outcome handed to the
event loop (`call_soon_threadsafe`); a stream-stream call takes its requests from a queue
(gRPC's own thread sends them) and a thread of its own hands the answers to the loop.

What this does NOT do: more of grpc.aio than `MasterConnection` uses — `unary_unary` and
`stream_stream` multicallables (a unary call is awaited; a stream has `write`, `read`,
which gives `grpc.aio.EOF` at the end, and `cancel`) and `close`. A stream's `write` never
fails: a stream that ended says so on the next `read`.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Coroutine
from typing import Any

import grpc

_END = object()  # ends a stream's requests


class ThreadedChannel:
    """`channel` (a synchronous grpc.Channel) as the asyncio client calls a grpc.aio channel."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._channel = channel

    # the generated stub passes the (de)serializers and `_registered_method` through as they are
    def unary_unary(self, method: str, **options: Any) -> _UnaryUnary:
        return _UnaryUnary(self._channel.unary_unary(method, **options))

    def stream_stream(self, method: str, **options: Any) -> _StreamStream:
        return _StreamStream(self._channel.stream_stream(method, **options))

    async def close(self) -> None:
        """Closes the channel: calls under way end CANCELLED."""
        self._channel.close()


class _UnaryUnary:
    def __init__(self, multicallable: grpc.UnaryUnaryMultiCallable) -> None:
        self._multicallable = multicallable

    def __call__(self, request: Any, *, timeout: float | None = None,
                 metadata: Any = None) -> Coroutine[Any, Any, Any]:
        return _outcome(self._multicallable.future(request, timeout=timeout, metadata=metadata))


async def _outcome(call: grpc.Future) -> Any:
    """The answer of `call`, awaited on the loop; raises the call's grpc.RpcError. Cancelling
    the awaiting task cancels the call."""
    loop = asyncio.get_running_loop()
    landed = loop.create_future()

    def settle() -> None:
        if not landed.done():
            landed.set_result(None)

    def on_done(_: grpc.Future) -> None:  # in gRPC's thread, or at once when already done
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(settle)

    call.add_done_callback(on_done)
    try:
        await landed
    except asyncio.CancelledError:
        call.cancel()
        raise
    return call.result()


class _StreamStream:
    def __init__(self, multicallable: grpc.StreamStreamMultiCallable) -> None:
        self._multicallable = multicallable

    def __call__(self, *, timeout: float | None = None, metadata: Any = None) -> _StreamCall:
        return _StreamCall(self._multicallable, timeout=timeout, metadata=metadata)


class _StreamCall:
    """One stream-stream call: requests through a queue, answers read by a thread of its own."""

    def __init__(self, multicallable: grpc.StreamStreamMultiCallable, *, timeout: float | None,
                 metadata: Any) -> None:
        self._loop = asyncio.get_running_loop()
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._answers: asyncio.Queue = asyncio.Queue()
        self._call = multicallable(iter(self._requests.get, _END), timeout=timeout, metadata=metadata)
        threading.Thread(target=self._read, name="master-stream", daemon=True).start()

    def _read(self) -> None:
        try:
            for answer in self._call:
                self._hand(answer)
            self._hand(grpc.aio.EOF)
        except grpc.RpcError as error:
            self._hand(error)
        finally:
            self._requests.put(_END)  # gRPC's sending thread stops too

    def _hand(self, item: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody reads any more
            self._loop.call_soon_threadsafe(self._answers.put_nowait, item)

    async def write(self, request: Any) -> None:
        self._requests.put(request)

    async def read(self) -> Any:
        """The next answer; grpc.aio.EOF once the master ended the stream. Raises the call's
        grpc.RpcError when it failed (and again on every later read)."""
        item = await self._answers.get()
        if item is grpc.aio.EOF or isinstance(item, BaseException):
            self._answers.put_nowait(item)  # the end stays the end
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> bool:
        self._requests.put(_END)
        return self._call.cancel()
