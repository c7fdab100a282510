"""The master's one authorization interceptor: every Master RPC is checked here, before any servicer code.

A call's `authorization: Bearer <token>` metadata becomes a `Principal` through
`paddlecloud.auth.TokenRoles` (the one mapping); then this table decides:

| RPC | who |
| --- | --- |
| RegisterTrainer | the trainer token, the operator token |
| KeepAlive, LeaveTrainer, GetTask, GetTaskStream, TaskFinished, TaskFailed, ReturnTask, RequestSaveModel, SplitTask | the session token of the request's `session_id` only (of a stream's every request) |
| GetStatus, ListTasks, ListTrainers | any token of the job (session ids and attempts shown to the operator only) |
| RestartEpoch, SetDataset, ScaleTrainers, EvictTrainer, and any Master RPC not named here | the operator token |
| GetStatus, ScaleTrainers | also the scaler token (the cluster autoscaler's; nothing else) |
| health, reflection | anyone (no token) |

The scaler token (`--scaler-token-file`) is not a job's: one token of the cluster's
autoscaler, accepted by every master that mounts it, so it may resize a job within its
range and read its status (which shows no session id) and nothing more — not the listings,
not a session, not RestartEpoch or SetDataset.

No token, or one that is not the job's: UNAUTHENTICATED, and a wrong role PERMISSION_DENIED,
both decided from the metadata before the request's message is read or parsed. A session token used
for another session: PERMISSION_DENIED. The servicer never
reads metadata: it asks `caller()` (a context variable set here for the call) whether
the caller is the operator.

A master started without tokens (`--insecure`, or on loopback) lets every call
through as the operator, and says so at start. It serves without the interceptor:
`caller()` is the operator by default, and gRPC's interceptor path costs every call a
chain of coroutines and a new method handler.

What this does NOT do: rate limiting (registrations are bounded per token by the
servicer, `master.rate_limit`). Of streaming methods it serves those that stream
both ways (GetTaskStream); any other kind would be refused as unimplemented.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from master.malformed import Malformed
from paddlecloud.api import SERVICE_NAME
from paddlecloud.auth import Principal, Role, TokenRoles, bearer_token
from paddlecloud.untrusted import quote

logger = logging.getLogger(__name__)

SESSION_RPCS = frozenset({"KeepAlive", "LeaveTrainer", "GetTask", "GetTaskStream", "TaskFinished", "TaskFailed",
                          "ReturnTask", "RequestSaveModel", "SplitTask"})
READ_RPCS = frozenset({"GetStatus", "ListTasks", "ListTrainers"})
SCALER_RPCS = frozenset({"GetStatus", "ScaleTrainers"})  # all the scaler token may call
REGISTER_RPCS = frozenset({"RegisterTrainer"})

_OPEN = Principal(Role.OPERATOR)  # every caller of a master without tokens
_CALLER: contextvars.ContextVar[Principal] = contextvars.ContextVar("caller", default=_OPEN)
_PREFIX = f"/{SERVICE_NAME}/"


def caller() -> Principal:
    """The principal of the Master RPC being served (the operator on a master without tokens)."""
    return _CALLER.get()


def denial(rpc: str, principal: Principal) -> str | None:
    """Why `principal` may not call `rpc` at all; None when it may (a session RPC still
    checks the request's session)."""
    if principal.role is Role.SCALER:
        if rpc in SCALER_RPCS:
            return None
        return f"{rpc} is not for the scaler token: it may call GetStatus and ScaleTrainers only"
    if rpc in READ_RPCS:
        return None
    if rpc in SESSION_RPCS:
        if principal.session is None:
            return (f"{rpc} needs the session token RegisterTrainer returned, not the "
                    f"{principal.role.value} token")
        return None
    if rpc in REGISTER_RPCS:
        if principal.session is not None or principal.role not in (Role.TRAINER, Role.OPERATOR):
            return f"{rpc} needs the job's trainer token"
        return None
    if principal.role is not Role.OPERATOR or principal.session is not None:
        return f"{rpc} needs the job's operator token"
    return None


Behavior = Callable[[object, grpc.aio.ServicerContext], Awaitable[object]]


def _handler(handler: grpc.RpcMethodHandler, behavior: Behavior) -> grpc.RpcMethodHandler:
    """`behavior` served as `handler`'s kind (unary, or a stream both ways: GetTaskStream)."""
    make = (grpc.stream_stream_rpc_method_handler if handler.stream_stream is not None
            else grpc.unary_unary_rpc_method_handler)
    return make(behavior, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


def _refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A refusal decided from the metadata: served as a stream whose requests are never read,
    so a caller without the right token costs no parsing whatever its message's size
    (gRPC reads a unary call's message before its behaviour runs, a stream's only when asked)."""
    async def refuse(requests: AsyncIterator, context: grpc.aio.ServicerContext) -> object:
        await context.abort(code, message)

    return grpc.stream_unary_rpc_method_handler(refuse, response_serializer=handler.response_serializer)


async def _own_session(request, principal: Principal, context: grpc.aio.ServicerContext) -> None:
    if isinstance(request, Malformed):
        return  # no session to compare: the Master service's handler refuses it (`master.malformed`)
    if request.session_id != principal.session:
        await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                            f"session {quote(str(request.session_id))} is not the session of "
                            "this token: a trainer acts on its own session only")


def _as(handler: grpc.RpcMethodHandler, principal: Principal, *, bound: bool) -> grpc.RpcMethodHandler:
    if handler.stream_stream is not None:
        return _stream_as(handler, principal, bound=bound)
    inner = handler.unary_unary

    async def guarded(request, context: grpc.aio.ServicerContext) -> object:
        if bound:
            await _own_session(request, principal, context)
        reset = _CALLER.set(principal)
        try:
            return await inner(request, context)
        finally:
            _CALLER.reset(reset)

    return _handler(handler, guarded)


def _stream_as(handler: grpc.RpcMethodHandler, principal: Principal, *, bound: bool) -> grpc.RpcMethodHandler:
    """A stream's every request is checked as a unary call's is; the caller is set for the
    stream's task (gRPC runs each RPC in a task of its own, so it needs no reset)."""
    inner = handler.stream_stream

    async def checked(requests: AsyncIterator, context: grpc.aio.ServicerContext) -> AsyncIterator:
        async for request in requests:
            await _own_session(request, principal, context)
            yield request

    async def guarded(requests: AsyncIterator, context: grpc.aio.ServicerContext) -> AsyncIterator:
        _CALLER.set(principal)
        async for reply in inner(checked(requests, context) if bound else requests, context):
            yield reply

    return _handler(handler, guarded)


class Authorization(grpc.aio.ServerInterceptor):
    """Checks every Master RPC against `roles`; with `roles` None every caller is the operator."""

    def __init__(self, roles: TokenRoles | None) -> None:
        self.roles = roles

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(_PREFIX):
            return handler  # health, reflection, unknown methods: grpc answers them
        rpc = details.method[len(_PREFIX):]
        if handler.unary_unary is None and handler.stream_stream is None:
            return _refusal(handler, grpc.StatusCode.UNIMPLEMENTED, f"{rpc} is neither unary nor a stream both ways")
        if self.roles is None:
            return _as(handler, _OPEN, bound=False)
        principal = self.roles.principal_of(bearer_token(details.invocation_metadata))
        if principal is None:
            return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED,
                            "no valid token of this job: send metadata 'authorization: Bearer TOKEN' "
                            "(the file named by PADDLE_JOB_TOKEN_FILE)")
        why = denial(rpc, principal)
        if why is not None:
            return _refusal(handler, grpc.StatusCode.PERMISSION_DENIED, why)
        return _as(handler, principal, bound=rpc in SESSION_RPCS)
