"""Connecting to etcd: the first endpoint that answers, its credentials proved by one read.

`connect()` tries each endpoint in turn until one answers within the deadline, or fails
fast naming every endpoint it tried; etcd refusing the credentials is an `EtcdAuthError`
at once (no retry helps). The client is `paddlecloud.etcd.aetcd_client.Client`: aetcd's,
on a channel of our own (TLS) with a token renewed when etcd's expires.
"""

from __future__ import annotations

import asyncio

import aetcd
import grpc

from paddlecloud.etcd.aetcd_client import Client
from paddlecloud.etcd.credentials import EtcdCredentials, refuse_plaintext_password
from paddlecloud.etcd.endpoints import parse_endpoints, uses_tls
from paddlecloud.etcd.errors import EtcdAuthError, EtcdUnavailable, is_auth_failure

RPC_TIMEOUT = 10.0  # seconds; any single etcd call longer than this is treated as a failure


# A watch that catches up sends up to 1,000 revisions in one message, so a job whose group
# commits are large overflows gRPC's default 4 MiB (a history replay after a failover of
# a thousand trainers does). etcd's own Go client receives any size (MaxCallRecvMsgSize: MaxInt32).
RECEIVE_ANY_SIZE = {"grpc.max_receive_message_length": -1}


async def connect(endpoints: str, *, timeout: float = 10.0,
                  credentials: EtcdCredentials | None = None,
                  probe: bytes = b"/paddlecloud/") -> Client:
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
            client = Client(host=host, port=port, tls=tls, **kwargs)
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
