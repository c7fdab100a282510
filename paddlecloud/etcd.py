"""etcd plumbing shared by the master, the agents and the CLI, on top of `aetcd`.

Three small types in the vocabulary of etcd's Go `concurrency` package:
`Session` (a lease plus the keep-alive loop that owns it), `Election` (campaign on
one key, observe the leader, fence writes on the won key), and `connect()` that
finds a live endpoint or fails fast naming every endpoint it tried.

Secured etcd: `https://` endpoints use TLS with `EtcdCredentials` (a CA, and a
client certificate and key for client-certificate auth; aetcd itself only dials
plaintext, so `_Client` opens the TLS channel), and a user and password log in
(aetcd's `Authenticate`). Credentials come from flags or the environment:
`PADDLE_ETCD_CA_FILE`, `PADDLE_ETCD_CERT_FILE`, `PADDLE_ETCD_KEY_FILE`,
`PADDLE_ETCD_USER` and `PADDLE_ETCD_PASSWORD_FILE` (a mounted Secret) or
`PADDLE_ETCD_PASSWORD`. `connect()` proves the credentials with one read under
`/paddlecloud/`: wrong ones raise `EtcdAuthError` at once (no retry helps).

A password travels only over TLS: a user and password with `http://` endpoints are refused
before anything is dialled (`refuse_plaintext_password`, in `connect()`, so every process that
would send them — the master, its lease process, the pserver agent, `job delete`, the
operator — stops with one error naming the endpoint), unless
`PADDLE_ETCD_ALLOW_PLAINTEXT_PASSWORD=1` says the link is trusted (a loopback etcd in a test).
Anyone on the path of a plaintext link (or an endpoint a submitter chose) would read it.

etcd's simple auth tokens expire after `--auth-token-ttl` (300 s) without use, and
aetcd logs in only once: a call answered "invalid auth token" logs in again and is
retried once with the new token (`_Reauthenticating`), so an idle client (a standby
master) keeps working.

What this does NOT do: renew the token of a stream already open (a watch or a lease
keep-alive stream keeps the token it started with; etcd checks it when the stream
opens), and it never keeps a *trainer's* lease alive (the master refreshes those
only when the trainer calls, see `master.sessions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aetcd
import grpc
from aetcd import rpc, watcher

from paddlecloud.aio import cancel_and_wait

logger = logging.getLogger(__name__)

RPC_TIMEOUT = 10.0  # seconds; any single etcd call longer than this is treated as a failure
MIN_LEASE_TTL = 2.0  # seconds; etcd grants no shorter lease (a session's or an election's)


class EtcdUnavailable(RuntimeError):
    """etcd did not answer; the message names the endpoints tried."""


class EtcdAuthError(EtcdUnavailable):
    """etcd refused our credentials (or asked for some we lack): retrying cannot help."""


_AUTH_FAILURES = ("user name is empty", "authentication failed", "permission denied",
                  "invalid auth token", "user name not found", "auth: ")


@dataclass(frozen=True)
class EtcdCredentials:
    """How to prove who we are to etcd; empty: plaintext, no auth."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("an etcd client certificate and its key go together "
                             "(PADDLE_ETCD_CERT_FILE, PADDLE_ETCD_KEY_FILE)")
        if bool(self.user) != (self.password is not None):
            raise ValueError("an etcd user and its password go together "
                             "(PADDLE_ETCD_USER, PADDLE_ETCD_PASSWORD_FILE)")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, password_file: str | None = None,
                 **given: str | None) -> EtcdCredentials:
        """From flags (`given`, non-empty wins) and else the PADDLE_ETCD_* variables."""
        env = os.environ if env is None else env
        names = {"ca_file": "PADDLE_ETCD_CA_FILE", "cert_file": "PADDLE_ETCD_CERT_FILE",
                 "key_file": "PADDLE_ETCD_KEY_FILE", "user": "PADDLE_ETCD_USER"}
        values = {k: given.get(k) or env.get(v) or None for k, v in names.items()}
        password = env.get("PADDLE_ETCD_PASSWORD")
        password_file = password_file or env.get("PADDLE_ETCD_PASSWORD_FILE")
        # read only for a user: a job whose Secret holds none (etcd without auth) mounts an
        # empty directory where the password file would be
        if password_file and values["user"]:
            try:
                password = Path(password_file).read_text().rstrip("\n")
            except OSError as error:
                raise ValueError(f"cannot read the etcd password file {password_file}: {error.strerror}") from None
        return cls(**values, password=password if values["user"] else None)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        def read(path: str | None) -> bytes | None:
            if not path:
                return None
            try:
                return Path(path).read_bytes()
            except OSError as error:
                raise ValueError(f"cannot read {path}: {error.strerror}") from None
        return grpc.ssl_channel_credentials(root_certificates=read(self.ca_file),
                                            private_key=read(self.key_file),
                                            certificate_chain=read(self.cert_file))


PLAINTEXT_PASSWORD_ENV = "PADDLE_ETCD_ALLOW_PLAINTEXT_PASSWORD"  # "1": send a password over http://


def refuse_plaintext_password(endpoints: str, credentials: EtcdCredentials,
                              env: Mapping[str, str] | None = None, *, root: bool = False) -> None:
    """Raises EtcdAuthError when `credentials` hold a password and `endpoints` are plaintext
    (`http://`), unless PADDLE_ETCD_ALLOW_PLAINTEXT_PASSWORD=1 in `env` (the process's).
    `root`: the credentials manage etcd's users (paddlecloud.etcd_users): no opt-in, since a
    job's endpoints may come from its submitter."""
    env = os.environ if env is None else env
    allowed = not root and env.get(PLAINTEXT_PASSWORD_ENV) == "1"
    if not credentials.user or uses_tls(endpoints) or allowed:
        return
    fix = ("use the cluster's https:// etcd endpoints (root's password never goes in plaintext)"
           if root else f"use https:// endpoints (PADDLE_ETCD_CA_FILE), or set "
           f"{PLAINTEXT_PASSWORD_ENV}=1 where that link is trusted (a loopback etcd)")
    raise EtcdAuthError(f"refusing to send the password of etcd user {credentials.user[:64]!r} "
                        f"in plaintext to {endpoints[:200]}: {fix}")


INVALID_TOKEN = "invalid auth token"  # etcd's answer to an expired (or revoked) auth token


def _token_expired(error: grpc.aio.AioRpcError) -> bool:
    return error.code() == grpc.StatusCode.UNAUTHENTICATED and INVALID_TOKEN in (error.details() or "")


class _Reauthenticating:
    """A stub whose unary calls, on etcd's "invalid auth token" (a simple token expires after
    `--auth-token-ttl` without use, 300 s by default), log in again and are retried once with
    the new token; other calls (streams) pass through.

    Not a `grpc.aio` client interceptor: a channel with one runs every unary call (the group
    commit's Txn included) through an extra task and two more coroutines; this is a plain
    coroutine around the call."""

    def __init__(self, stub: Any, client: _Client) -> None:
        self._stub = stub
        self._client = client

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)
        if isinstance(method, grpc.aio.UnaryUnaryMultiCallable):
            method = functools.partial(self._call, method)
        setattr(self, name, method)  # found once per method
        return method

    async def _call(self, method: grpc.aio.UnaryUnaryMultiCallable, request: Any, **kwargs: Any) -> Any:
        try:
            return await method(request, **kwargs)
        except grpc.aio.AioRpcError as error:
            if not _token_expired(error) or self._client.username is None:
                raise
        metadata = tuple(kwargs.get("metadata") or ())
        token = await self._client.reauthenticate(stale=dict(metadata).get("token"))
        kwargs["metadata"] = (*((k, v) for k, v in metadata if k != "token"), ("token", token))
        return await method(request, **kwargs)


class _Client(aetcd.Client):
    """aetcd's client on a channel of our own: TLS when given (aetcd dials plaintext only), and
    a fresh auth token when etcd says ours expired (aetcd logs in once, at connect, and never
    again); the rest is aetcd's. Long-lived streams (watches, lease keep-alives) present the
    token they started with: one that etcd refuses is restarted by its owner, with the
    token of `metadata` then."""

    def __init__(self, *, host: str, port: int, tls: grpc.ChannelCredentials | None, **kwargs) -> None:
        super().__init__(host=host, port=port, **kwargs)
        self._tls = tls
        self._auth_lock = asyncio.Lock()

    @property
    def username(self) -> str | None:
        return self._username

    async def _authenticate(self) -> str:
        reply = await self.auth_stub.Authenticate(
            rpc.AuthenticateRequest(name=self._username, password=self._password),
            timeout=self._timeout)
        self.metadata = (("token", reply.token),)
        if self._watcher is not None:
            self._watcher._metadata = self.metadata  # the token of watch streams started later
        return reply.token

    async def reauthenticate(self, *, stale: str | None) -> str:
        """A valid token: the current one when another call renewed `stale` already."""
        async with self._auth_lock:
            current = dict(self.metadata or ()).get("token")
            if current and current != stale:
                return current
            token = await self._authenticate()
            logger.info("etcd auth token of user %s expired: logged in again", self._username)
            return token

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        self._is_connecting = True
        try:
            target, options = f"{self._host}:{self._port}", list(self._options.items())
            self.channel = (grpc.aio.secure_channel(target, self._tls, options=options)
                            if self._tls is not None
                            else grpc.aio.insecure_channel(target, options=options))
            if self._username is not None:
                self.auth_stub = rpc.AuthStub(self.channel)
                await self._authenticate()
            self.kvstub = _Reauthenticating(rpc.KVStub(self.channel), self)
            self.clusterstub = _Reauthenticating(rpc.ClusterStub(self.channel), self)
            self.leasestub = _Reauthenticating(rpc.LeaseStub(self.channel), self)
            self.maintenancestub = _Reauthenticating(rpc.MaintenanceStub(self.channel), self)
            self._watcher = watcher.Watcher(rpc.WatchStub(self.channel), timeout=self._timeout,
                                            metadata=self.metadata)
            self._connected.set()
        finally:
            self._is_connecting = False


def uses_tls(text: str) -> bool:
    """Whether the endpoints are `https://` (all of them; a mix is refused by parse_endpoints)."""
    return any(p.strip().startswith("https://") for p in text.split(","))


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """`http://10.0.0.1:2379,127.0.0.1:2379` -> [(host, port), ...]; errors name the bad part.

    `https://` endpoints are TLS (see `EtcdCredentials`); all endpoints share one scheme."""
    endpoints = []
    schemes = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        url = urlsplit(part if "://" in part else f"http://{part}")
        if url.scheme not in ("http", "https", "") or not url.hostname:
            raise ValueError(
                f"invalid etcd endpoint {part[:100]!r}: expected http://HOST:PORT or https://HOST:PORT"
            )
        schemes.add(url.scheme)
        if len(schemes) > 1:
            raise ValueError(f"etcd endpoints {text[:200]!r} mix http:// and https://: use one scheme")
        try:
            port = url.port or 2379
        except ValueError:
            raise ValueError(f"invalid etcd endpoint {part!r}: bad port") from None
        endpoints.append((url.hostname, port))
    if not endpoints:
        raise ValueError(f"no etcd endpoint in {text!r}")
    return endpoints


def is_auth_failure(error: BaseException) -> bool:
    text = str(error).lower()
    return (isinstance(error, aetcd.exceptions.UnauthenticatedError)
            or (isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.UNAUTHENTICATED)
            or any(marker in text for marker in _AUTH_FAILURES))


# A watch that catches up sends up to 1,000 revisions in one message, so a job whose group
# commits are large overflows gRPC's default 4 MiB (a history replay after a failover of
# a thousand trainers does). etcd's own Go client receives any size (MaxCallRecvMsgSize: MaxInt32).
RECEIVE_ANY_SIZE = {"grpc.max_receive_message_length": -1}


async def connect(endpoints: str, *, timeout: float = 10.0,
                  credentials: EtcdCredentials | None = None,
                  probe: bytes = b"/paddlecloud/") -> aetcd.Client:
    """Returns a client of the first endpoint that answers within `timeout` seconds in all.

    `credentials` default to the environment's (`EtcdCredentials.from_env()`); `probe` is
    the key read to prove them (a job's own etcd user may read only its job's prefix,
    `paddlecloud.etcd_users`). Raises EtcdAuthError at once when etcd refuses them or they
    hold a password for `http://` endpoints (nothing dialled), EtcdUnavailable when none
    answers."""
    errors = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    candidates = parse_endpoints(endpoints)
    creds = credentials if credentials is not None else EtcdCredentials.from_env()
    refuse_plaintext_password(endpoints, creds)
    tls = creds.channel_credentials() if uses_tls(endpoints) else None
    while True:
        for host, port in candidates:
            kwargs = {"username": creds.user, "password": creds.password, "timeout": RPC_TIMEOUT,
                      "options": RECEIVE_ANY_SIZE}
            client = _Client(host=host, port=port, tls=tls, **kwargs)
            try:
                remaining = max(0.2, min(2.0, deadline - loop.time()))
                await asyncio.wait_for(client.status(), remaining)
                # status() needs no auth: one read proves the credentials and the rights
                # on `probe` (the user needs readwrite on its prefix)
                await asyncio.wait_for(client.get(probe), max(remaining, 2.0))
                return client
            except (aetcd.ClientError, grpc.RpcError, asyncio.TimeoutError, OSError) as error:
                await client.close()
                if is_auth_failure(error):
                    raise EtcdAuthError(
                        f"etcd at {host}:{port} refused our credentials: {error} (check "
                        "PADDLE_ETCD_USER / PADDLE_ETCD_PASSWORD_FILE, the client certificate, and "
                        f"that the user may read and write {probe.decode(errors='replace')})"
                    ) from None
                errors.append(f"{host}:{port}: {type(error).__name__} {error}".strip())
        if loop.time() >= deadline:
            raise EtcdUnavailable(
                f"etcd unreachable at {endpoints} after {timeout:g}s ({errors[-1]})"
            )
        await asyncio.sleep(0.2)


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


class LeaseKeeper:
    """Refreshes leases over one long-lived LeaseKeepAlive stream.

    aetcd opens a new stream per refresh; a master refreshing many trainer leases
    would pay a stream set-up each time, so this multiplexes them on one stream.
    `refresh(lease)` returns the remaining TTL, 0 when the lease is gone (an answer for
    the lease answers every caller waiting on it: a refresh is a refresh);
    `refresh_soon(lease)` only queues the request (no future, no wait): for a refresh
    whose answer nobody needs, e.g. one piggybacked on a trainer's call.

    A stream that breaks is opened again at once (then after 0.1 s doubling to 2 s while it
    keeps breaking), and every lease asked for and not yet answered is asked again on it:
    a refresh is idempotent. etcd under a burst of writes ends the stream now and then
    ("waiting for the applied index took too long"): its leader renews a lease only once
    it has applied every committed entry, waits at most a second for that, and ends the
    whole LeaseKeepAlive stream with that error. Dropping the refreshes queued on it would
    let every session waiting on them lapse together. A caller of `refresh` still waits no
    longer than its timeout.
    """

    def __init__(self, client: aetcd.Client, *,
                 on_answer: Callable[[int, int], None] | None = None) -> None:
        self._client = client
        self._on_answer = on_answer  # called with (lease, TTL) for every answer
        self._requests: asyncio.Queue[int] = asyncio.Queue()
        self._waiters: dict[int, list[asyncio.Future[int]]] = {}
        self._unanswered: dict[int, None] = {}  # leases asked for on the stream, in order
        self._served = False  # the current stream answered something (it was not a failed open)
        self._reader: asyncio.Task[None] | None = None

    async def refresh(self, lease_id: int, *, timeout: float = RPC_TIMEOUT) -> int:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(lease_id, []).append(future)
        self.refresh_soon(lease_id)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            raise EtcdUnavailable(f"etcd did not refresh lease {lease_id:x} in {timeout:g}s") from None
        finally:
            waiters = self._waiters.get(lease_id)
            if waiters is not None:
                with contextlib.suppress(ValueError):
                    waiters.remove(future)
                if not waiters:
                    del self._waiters[lease_id]

    def refresh_soon(self, lease_id: int) -> None:
        self.start()
        self._unanswered[lease_id] = None
        self._requests.put_nowait(lease_id)

    def start(self) -> None:
        """Opens the stream now rather than at the first refresh (which would wait for it)."""
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._run(), name="lease-keeper")

    @staticmethod
    async def _requests_of(queue: asyncio.Queue[int]):
        while True:  # bound to one stream's queue: a broken stream's iterator takes no more
            yield rpc.LeaseKeepAliveRequest(ID=await queue.get())

    async def _run(self) -> None:
        delay = 0.0
        while True:
            if delay:
                await asyncio.sleep(delay)
            self._requests = asyncio.Queue()
            for lease in self._unanswered:  # asked for on the stream that broke: ask again
                self._requests.put_nowait(lease)
            self._served = False
            try:
                await self._stream(self._requests)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                # once per outage: while etcd stays away the stream breaks every 2 s
                logger.log(logging.DEBUG if delay else logging.WARNING,
                           "lease keep-alive stream broke (%s); asking again for the %d "
                           "lease(s) it had not answered", error, len(self._unanswered))
            delay = 0.0 if self._served else min(max(2 * delay, 0.1), 2.0)

    async def _stream(self, queue: asyncio.Queue[int]) -> None:
        """Serves one stream until it ends."""
        await self._client.connect()
        stream = self._client.leasestub.LeaseKeepAlive(self._requests_of(queue),
                                                       metadata=self._client.metadata)
        async for reply in stream:
            self._answered(reply.ID, reply.TTL)

    def _answered(self, lease: int, ttl: int) -> None:
        self._served = True
        self._unanswered.pop(lease, None)
        for future in self._waiters.pop(lease, ()):
            if not future.done():
                future.set_result(ttl)
        if self._on_answer is not None:
            self._on_answer(lease, ttl)

    async def close(self) -> None:
        await cancel_and_wait(self._reader)
        self._reader = None
        self._unanswered.clear()
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_exception(EtcdUnavailable("lease keeper closed"))
        self._waiters.clear()


class Session:
    """A lease of `ttl` seconds and the loop that keeps it alive every ttl/3.

    `lost` is set when the lease can no longer be kept (expired, revoked, or etcd
    unreachable past the TTL): everything bound to it must be considered gone.
    """

    def __init__(self, client: aetcd.Client, *, ttl: float) -> None:
        self.client = client
        self.ttl = max(1, round(ttl))
        self.lease_id = 0
        self.lost = asyncio.Event()
        self._keeper = LeaseKeeper(client)
        self._loop_task: asyncio.Task[None] | None = None

    async def open(self) -> Session:
        lease = await self.client.lease(self.ttl)
        self.lease_id = lease.id
        self._loop_task = asyncio.create_task(self._keep_alive(), name=f"session-{lease.id:x}")
        return self

    async def _keep_alive(self) -> None:
        loop = asyncio.get_running_loop()
        expires = loop.time() + self.ttl
        try:
            while True:
                await asyncio.sleep(self.ttl / 3)
                try:
                    remaining = await self._keeper.refresh(self.lease_id, timeout=self.ttl / 3)
                except EtcdUnavailable as error:
                    if loop.time() >= expires:
                        logger.warning("session %x lost: %s", self.lease_id, error)
                        break
                    continue
                if remaining <= 0:
                    logger.warning("session %x expired", self.lease_id)
                    break
                expires = loop.time() + remaining
        finally:
            self.lost.set()

    async def close(self, *, revoke: bool = True) -> None:
        """Stops the keep-alive loop and, unless the lease is already lost, revokes it so
        every key on it goes at once."""
        was_lost = self.lost.is_set()  # the loop sets `lost` when cancelled: look first
        await cancel_and_wait(self._loop_task)
        await self._keeper.close()
        if revoke and self.lease_id and not was_lost:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.client.revoke_lease(self.lease_id), 2)
        self.lost.set()


@dataclass(frozen=True)
class Leadership:
    """Proof of a won election: the leader key and its creation revision (the fence)."""

    key: bytes
    create_revision: int

    def fence(self) -> rpc.Compare:
        """A compare that holds only while this leadership stands."""
        return rpc.Compare(
            key=self.key,
            target=rpc.Compare.CREATE,
            result=rpc.Compare.EQUAL,
            create_revision=self.create_revision,
        )


class Election:
    """Campaigns for one key: the winner holds it on its session's lease."""

    def __init__(self, session: Session, key: bytes) -> None:
        self.session = session
        self.key = key

    async def campaign(self, value: str, *, on_leader: Callable[[str], None] | None = None,
                       reclaim: Iterable[int] = ()) -> Leadership:
        """Waits until this session holds the key; calls `on_leader` with each other leader seen.

        `reclaim`: leases the caller has proved dead or abandoned (a dead predecessor's:
        `master.presence.dead_predecessor`; its own earlier sessions'): the key holding
        `value` on one of them is revoked (once each) instead of waited out."""
        client = self.session.client
        reclaim = set(reclaim)
        while True:
            succeeded, responses = await client.transaction(
                compare=[client.transactions.create(self.key) == 0],
                success=[client.transactions.put(self.key, value.encode(), lease=self.session.lease_id)],
                failure=[client.transactions.get(self.key)],
            )
            if succeeded:
                current = await client.get(self.key)
                if current is not None and current.lease == self.session.lease_id:
                    return Leadership(self.key, current.create_revision)
                continue
            if responses and responses[0]:
                value_now, meta = responses[0][0]
                if meta.lease == self.session.lease_id:  # ours from an earlier attempt
                    return Leadership(self.key, meta.create_revision)
                if meta.lease in reclaim and value_now == value.encode():
                    reclaim.discard(meta.lease)  # once: a lease that will not go is waited out
                    logger.warning("the leader key names this campaigner's own address %s on lease %x, "
                                   "which no live campaigner holds (a dead predecessor's, or an earlier "
                                   "session of this one): revoking it", value, meta.lease)
                    with contextlib.suppress(aetcd.ClientError):  # gone already: no matter
                        await client.revoke_lease(meta.lease)
                    continue
                if on_leader is not None:
                    on_leader(value_now.decode())
                await self._wait_deleted(meta.mod_revision)

    async def _wait_deleted(self, seen_revision: int) -> None:
        client = self.session.client
        watch = await client.watch(self.key, start_revision=seen_revision + 1)
        lost = asyncio.create_task(self.session.lost.wait())
        try:
            async def deleted() -> None:
                async for event in watch:
                    if event.kind == "DELETE":
                        return
            waiter = asyncio.create_task(deleted())
            done, _ = await asyncio.wait({waiter, lost}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if lost in done:
                raise EtcdUnavailable("session lost while waiting for the leader key")
            waiter_exc = None if waiter.cancelled() else waiter.exception()
            if waiter_exc is not None:
                raise waiter_exc
        finally:
            lost.cancel()
            with contextlib.suppress(Exception):
                await watch.cancel()

    async def leader(self) -> str | None:
        current = await self.session.client.get(self.key)
        return current.value.decode() if current is not None else None

    async def resign(self, leadership: Leadership) -> None:
        client = self.session.client
        with contextlib.suppress(Exception):
            await client.transaction(
                compare=[client.transactions.create(self.key) == leadership.create_revision],
                success=[client.transactions.delete(self.key)],
                failure=[],
            )
