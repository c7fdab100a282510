"""aetcd's client, on a channel of our own: TLS, and a fresh auth token when etcd's expires.

aetcd 1.0 dials plaintext only and logs in once, at connect: etcd's simple auth tokens
expire after `--auth-token-ttl` (300 s) without use, so an idle client (a standby master)
would be refused for good. `Client` opens the channel itself (TLS when given), logs in,
and keeps the token in one `AuthToken` that every call, and every watch stream opened later,
reads when it starts; a unary call answered "invalid auth token" logs in again and is retried
once (`ReauthenticatingStub`). The rest is aetcd's.

aetcd has no public API for either, so this module is the one place that leans on aetcd's
internals, and only on these (tests/test_etcd_aetcd_contract.py fails when one changes;
pyproject.toml bounds aetcd to the minor version it checks):

* every method of `aetcd.Client` calls `self.connect()` first, and passes `self.metadata`
  (public) to its call;
* its watches go through the `aetcd.watcher.Watcher` in `Client._watcher`: `connect` here
  puts one there, built with `Watcher(watch_stub, timeout=, metadata=)`, which sends that
  metadata when it opens a Watch stream; aetcd's `close()` shuts it down and resets it;
* aetcd's `close()` closes `self.channel` and resets the public channel attributes, so a
  later `connect` dials again.

Nothing else of aetcd's is read or written: the address, the login and the timeouts are
kept here too, and no field of the watcher is touched.

What this does NOT do: renew the token of a stream already open (a watch or a lease
keep-alive stream keeps the token it started with; etcd checks it when the stream opens):
one that etcd refuses is restarted by its owner, and presents the new token then.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from typing import Any

import aetcd
import grpc
from aetcd import rpc, watcher

logger = logging.getLogger(__name__)

INVALID_TOKEN = "invalid auth token"  # etcd's answer to an expired (or revoked) auth token


def _token_expired(error: grpc.aio.AioRpcError) -> bool:
    return error.code() == grpc.StatusCode.UNAUTHENTICATED and INVALID_TOKEN in (error.details() or "")


class AuthToken(Sequence):
    """The gRPC metadata `(("token", T),)` of the client's current token T.

    One object shared by the client's calls and its watcher: gRPC copies metadata when a
    call or a stream starts (`tuple(metadata)`), so whatever starts after a renewal sends the
    new token without anyone holding the old one to be updated."""

    def __init__(self, token: str) -> None:
        self.token = token

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index):  # a Sequence's: an int or a slice
        return (("token", self.token),)[index]

    def __repr__(self) -> str:
        return "AuthToken(...)"  # a token is a credential: never in a log


class ReauthenticatingStub:
    """A stub whose unary calls, on etcd's "invalid auth token", log in again and are retried
    once with the new token; other calls (streams) pass through.

    Not a `grpc.aio` client interceptor: a channel with one runs every unary call (the group
    commit's Txn included) through an extra task and two more coroutines; this is a plain
    coroutine around the call."""

    def __init__(self, stub: Any, client: Client) -> None:
        self._stub = stub
        self._client = client

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)
        if isinstance(method, grpc.aio.UnaryUnaryMultiCallable):
            method = functools.partial(self._call, method)
        setattr(self, name, method)  # found once per method
        return method

    async def _call(self, method: grpc.aio.UnaryUnaryMultiCallable, request: Any, **kwargs: Any) -> Any:
        sent = tuple(kwargs.get("metadata") or ())  # what gRPC copies as the call starts
        try:
            return await method(request, **kwargs)
        except grpc.aio.AioRpcError as error:
            if not _token_expired(error) or self._client.username is None:
                raise
        token = await self._client.reauthenticate(stale=dict(sent).get("token"))
        kwargs["metadata"] = (*((k, v) for k, v in sent if k != "token"), ("token", token))
        return await method(request, **kwargs)


class Client(aetcd.Client):
    """aetcd's client on a channel this opens: TLS with `tls`, and a user's token renewed when
    etcd says it expired (see the module's docstring for what of aetcd this relies on)."""

    def __init__(self, *, host: str, port: int, tls: grpc.ChannelCredentials | None,
                 username: str | None = None, password: str | None = None,
                 timeout: float | None = None, options: dict[str, Any] | None = None) -> None:
        super().__init__(host=host, port=port, username=username, password=password,
                         timeout=timeout, options=options)
        self._target = f"{host}:{port}"
        self._tls = tls
        self._login = rpc.AuthenticateRequest(name=username, password=password) if username else None
        self._call_timeout = timeout
        self._channel_options = list((options or {}).items())
        self._connect_lock = asyncio.Lock()
        self._auth_lock = asyncio.Lock()

    @property
    def username(self) -> str | None:
        return self._login.name if self._login is not None else None

    async def connect(self) -> None:
        """Dials once; every aetcd method calls this first (concurrent callers wait for one)."""
        if self.channel is not None:
            return
        async with self._connect_lock:
            if self.channel is not None:
                return
            channel = (grpc.aio.secure_channel(self._target, self._tls, options=self._channel_options)
                       if self._tls is not None
                       else grpc.aio.insecure_channel(self._target, options=self._channel_options))
            try:
                auth_stub = rpc.AuthStub(channel)
                metadata = AuthToken(await self._authenticate(auth_stub)) if self._login else None
            except BaseException:
                await channel.close()
                raise
            self.channel, self.auth_stub, self.metadata = channel, auth_stub, metadata
            self.kvstub = ReauthenticatingStub(rpc.KVStub(channel), self)
            self.clusterstub = ReauthenticatingStub(rpc.ClusterStub(channel), self)
            self.leasestub = ReauthenticatingStub(rpc.LeaseStub(channel), self)
            self.maintenancestub = ReauthenticatingStub(rpc.MaintenanceStub(channel), self)
            self._watcher = watcher.Watcher(rpc.WatchStub(channel), timeout=self._call_timeout,
                                            metadata=metadata)

    async def _authenticate(self, auth_stub: rpc.AuthStub) -> str:
        reply = await auth_stub.Authenticate(self._login, timeout=self._call_timeout)
        return reply.token

    async def reauthenticate(self, *, stale: str | None) -> str:
        """A valid token: the current one when another call renewed `stale` already."""
        async with self._auth_lock:
            if self.metadata.token != stale:
                return self.metadata.token
            self.metadata.token = await self._authenticate(self.auth_stub)
            logger.info("etcd auth token of user %s expired: logged in again", self.username)
            return self.metadata.token
