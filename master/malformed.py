"""Requests that do not parse: INVALID_ARGUMENT and at most one log line a minute, never a traceback.

gRPC's own handling of a request deserialiser that raises is an ERROR with a full traceback
and `UNKNOWN` for the caller, on every call: anyone who reaches the port could fill the
master's disk with one-byte calls. So the Master service is registered here with request
deserialisers that never raise: bytes that are no message of the RPC's request type become
a `Malformed` marker, and the RPC's behaviour (wrapped here, innermost) answers it
`INVALID_ARGUMENT` naming the RPC, before any servicer code runs. The refusals are counted
and logged at most once per `LOG_EVERY` seconds (`Throttled`).

Parsing costs CPU in proportion to the message: a call with no valid token is therefore
refused from its metadata alone, before its message is read (`master.authorization`); only
the job's own callers get a request parsed at all.

What this does NOT do: validate a parsed request's values (the servicer does), or bound the
size of an authenticated caller's message (gRPC's 4 MiB receive limit does).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable

import grpc
from google.protobuf.message import DecodeError, Message

from paddlecloud.api import SERVICE_NAME, pb
from paddlecloud.untrusted import loggable

logger = logging.getLogger(__name__)

LOG_EVERY = 60.0  # seconds between two log lines about malformed requests


class Malformed:
    """The bytes of a request that are no message of its RPC's request type."""

    __slots__ = ("rpc", "size", "error")

    def __init__(self, rpc: str, size: int, error: str) -> None:
        self.rpc = rpc
        self.size = size
        self.error = error


class Throttled:
    """One log line per `every` seconds at most; the next one says how many were not logged."""

    def __init__(self, *, every: float = LOG_EVERY, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self.clock = clock
        self.last: float | None = None
        self.unlogged = 0

    def note(self, line: str) -> None:
        now = self.clock()
        if self.last is not None and now - self.last < self.every:
            self.unlogged += 1
            return
        more = f" (and {self.unlogged} more in the last {now - self.last:.0f}s)" if self.unlogged else ""
        self.last, self.unlogged = now, 0
        logger.warning("%s%s; refused as INVALID_ARGUMENT, logged at most every %.0fs", line, more, self.every)


def tolerant_deserializer(rpc: str, message: type[Message]) -> Callable[[bytes], Message | Malformed]:
    def parse(data: bytes) -> Message | Malformed:
        try:
            return message.FromString(data)
        except DecodeError as error:  # also a message nested too deep, or a bad UTF-8 string
            return Malformed(rpc, len(data), str(error))

    return parse


class Refusals:
    """The Master service's answer to a `Malformed` request, shared by its RPCs."""

    def __init__(self, throttle: Throttled | None = None) -> None:
        self.throttle = throttle or Throttled()

    async def refuse(self, request: Malformed, context: grpc.aio.ServicerContext) -> None:
        self.throttle.note(f"a malformed {request.rpc} request ({request.size} bytes) from "
                           f"{loggable(context.peer() or '?')}: {loggable(request.error)}")
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"the request is no {request.rpc} request: its bytes do not parse as "
                            f"paddlecloud.master.v1 protobuf ({request.size} bytes)")

    def unary(self, behavior):
        async def checked(request, context: grpc.aio.ServicerContext):
            if isinstance(request, Malformed):
                return await self.refuse(request, context)
            return await behavior(request, context)

        return checked

    def stream(self, behavior):
        refusals = self

        async def parsed(requests: AsyncIterator, context: grpc.aio.ServicerContext) -> AsyncIterator:
            async for request in requests:
                if isinstance(request, Malformed):
                    await refusals.refuse(request, context)
                yield request

        async def checked(requests: AsyncIterator, context: grpc.aio.ServicerContext) -> AsyncIterator:
            async for reply in behavior(parsed(requests, context), context):
                yield reply

        return checked


def master_handlers(servicer, refusals: Refusals | None = None) -> dict[str, grpc.RpcMethodHandler]:
    """The Master service's method handlers (from its descriptor, so none is forgotten), each
    deserialising with `tolerant_deserializer` and refusing a `Malformed` request."""
    refusals = refusals or Refusals()
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name["Master"].methods:
        request, reply = getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)
        behavior = getattr(servicer, method.name)
        parse = tolerant_deserializer(method.name, request)
        if method.client_streaming and method.server_streaming:
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                refusals.stream(behavior), request_deserializer=parse, response_serializer=reply.SerializeToString)
        elif not method.client_streaming and not method.server_streaming:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                refusals.unary(behavior), request_deserializer=parse, response_serializer=reply.SerializeToString)
        else:  # the service has no such RPC; one added must be served here first
            raise TypeError(f"{method.name} streams one way only: master.malformed serves unary and "
                            "both-ways streams")
    return handlers


def add_master_servicer(servicer, server: grpc.aio.Server) -> None:
    """What `pb_grpc.add_MasterServicer_to_server` does, with the tolerant deserialisers."""
    handlers = master_handlers(servicer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


__all__ = ["LOG_EVERY", "Malformed", "Throttled", "add_master_servicer", "master_handlers"]
