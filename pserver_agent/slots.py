"""Pserver slots in etcd: which agent serves index i, and at which endpoint.

Two keys per slot, under the job's prefix (docs/design.md section 6):

* `pservers/<i>` — the registration: on the serving agent's lease, value `HOST:PORT`.
  Present means "slot i has a live agent"; it vanishes when the agent revokes its
  lease on exit, or when the lease lapses (the agent died or lost etcd).
* `pserver-slots/<i>` — the slot's endpoint for the life of the job: written once,
  at the first claim of the slot, with no lease. An agent that takes the slot later
  serves that same endpoint, so the `PADDLE_PSERVERS_IP_PORT_LIST` the trainers hold
  stays right across pserver restarts.

A claim is one etcd transaction: create `pservers/<i>` only if it does not exist,
and, at the slot's first claim, create `pserver-slots/<i>` in the same transaction
only if that does not exist either (else: only if it still holds the endpoint read).
Two agents racing for a slot therefore never both win, as with the Go pserver's
`/ps/<i>` keys.

An agent can serve slot i only at an endpoint that is its own: the slot's endpoint
must have this agent's POD_IP as host and, when PADDLE_PORT is set, that port. An
agent looking for a free slot skips the others (it waits instead); an agent given
its index (Kubernetes) is told by an `AgentConfigError` that names both endpoints.

What this does NOT guarantee: that the endpoint's port is free when the pserver
binds it (a free port is chosen by binding and closing a socket, and another process
may take it before the pserver starts), nor that the pserver at an endpoint is
alive — the registration says only that its agent is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass

import aetcd

from paddlecloud.etcd import EtcdUnavailable
from paddlecloud.keys import JobKeys, prefix_range_end
from pserver_agent.config import AgentConfigError, split_endpoint

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claim:
    """A slot won: its index, its endpoint, and whether this claim fixed that endpoint."""

    index: int
    endpoint: str
    first: bool  # True: the slot had never been claimed; False: another pserver served it before

    @property
    def host(self) -> str:
        return split_endpoint(self.endpoint)[0]

    @property
    def port(self) -> int:
        return split_endpoint(self.endpoint)[1]


def pick_free_port(host: str) -> int:
    """A port nothing listens on right now, on `host` if it can be bound, else on any address."""
    for address in (host.strip("[]"), ""):
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as sock:
            try:
                sock.bind((address, 0))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise OSError(f"cannot bind a free port on {host!r} or on any address")


class SlotTable:
    """The pserver slots of one job as one agent sees them; claims on `lease_id`."""

    def __init__(self, client: aetcd.Client, keys: JobKeys, *, num_slots: int, lease_id: int,
                 pod_ip: str, port: int | None) -> None:
        self.client = client
        self.keys = keys
        self.num_slots = num_slots
        self.lease_id = lease_id
        self.pod_ip = pod_ip
        self.port = port

    async def claim(self, *, index: int | None) -> Claim:
        """Takes slot `index` (or the first free one), waiting while it is (they all are) taken."""
        candidates = list(range(self.num_slots)) if index is None else [index]
        last_note = ""
        while True:
            registered, revision = await self._read(self.keys.kind_prefix("pservers"))
            endpoints, _ = await self._read(self.keys.kind_prefix("pserver-slots"))
            skipped = []
            for i in candidates:
                if i in registered:
                    continue
                endpoint = self._endpoint_for(i, endpoints, fixed=index is not None)
                if endpoint is None:
                    skipped.append(i)
                    continue
                claim = await self._try_claim(i, endpoint, first=i not in endpoints)
                if claim is not None:
                    return claim
                break  # lost a race: read again
            else:
                note = self._waiting_note(index, registered, skipped, endpoints)
                if note != last_note:
                    logger.info("%s", note)
                    last_note = note
                await self._next_change(self.keys.kind_prefix("pservers"), revision)

    async def wait_all_registered(self) -> list[str]:
        """Waits until every slot 0..n-1 is registered; returns their endpoints in slot order."""
        last = -1
        while True:
            registered, revision = await self._read(self.keys.kind_prefix("pservers"))
            missing = [i for i in range(self.num_slots) if i not in registered]
            if not missing:
                endpoints = [registered[i] for i in range(self.num_slots)]
                _check_distinct(endpoints)
                return endpoints
            if len(missing) != last:
                logger.info("waiting for every pserver: %d of %d slots registered (missing %s)",
                            self.num_slots - len(missing), self.num_slots,
                            ", ".join(map(str, missing)))
                last = len(missing)
            await self._next_change(self.keys.kind_prefix("pservers"), revision)

    # -- internals --

    def _endpoint_for(self, index: int, endpoints: dict[int, str], *, fixed: bool) -> str | None:
        """The endpoint this agent would serve slot `index` at, or None if it cannot serve it."""
        known = endpoints.get(index)
        if known is not None:
            host, port = split_endpoint(known)
            if host == self.pod_ip and (self.port is None or port == self.port):
                return known
            if fixed:
                mine = f"{self.pod_ip}:{self.port}" if self.port else f"{self.pod_ip}:<any port>"
                raise AgentConfigError(
                    f"pserver slot {index} keeps endpoint {known} for the life of the job, but this "
                    f"agent would serve {mine} (POD_IP/PADDLE_PORT): run it where that endpoint is its own")
            return None
        taken = {e: i for i, e in endpoints.items()}
        if self.port is not None:
            endpoint = f"{self.pod_ip}:{self.port}"
            if endpoint not in taken:
                return endpoint
            if fixed:
                raise AgentConfigError(
                    f"endpoint {endpoint} already belongs to pserver slot {taken[endpoint]}, so slot "
                    f"{index} cannot have it: give each pserver its own POD_IP or PADDLE_PORT")
            return None
        for _ in range(100):
            endpoint = f"{self.pod_ip}:{pick_free_port(self.pod_ip)}"
            if endpoint not in taken:
                return endpoint
        raise OSError(f"no free port on {self.pod_ip} that no other pserver slot keeps")

    async def _try_claim(self, index: int, endpoint: str, *, first: bool) -> Claim | None:
        tx = self.client.transactions
        registration, slot = self.keys.pserver(index), self.keys.pserver_slot(index)
        value = endpoint.encode()
        if first:
            compare = [tx.create(registration) == 0, tx.create(slot) == 0]
            success = [tx.put(slot, value), tx.put(registration, value, lease=self.lease_id)]
        else:
            compare = [tx.create(registration) == 0, tx.value(slot) == value]
            success = [tx.put(registration, value, lease=self.lease_id)]
        succeeded, _ = await self.client.transaction(compare=compare, success=success, failure=[])
        return Claim(index, endpoint, first) if succeeded else None

    async def _read(self, prefix: bytes) -> tuple[dict[int, str], int]:
        """{index: value} of the keys under `prefix` below num_slots, and the revision read at."""
        reply = await self.client.get_prefix(prefix)
        found = {}
        for kv in reply:
            suffix = kv.key[len(prefix):]
            if suffix.isdigit() and int(suffix) < self.num_slots:
                found[int(suffix)] = kv.value.decode()
        return found, reply.header.revision

    async def _next_change(self, prefix: bytes, revision: int) -> None:
        """Returns at the first change under `prefix` after `revision`."""
        watch = await self.client.watch(prefix, range_end=prefix_range_end(prefix),
                                        start_revision=revision + 1)
        try:
            async for _ in watch:
                return
            raise EtcdUnavailable(f"the etcd watch of {prefix.decode()} ended")
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(watch.cancel())

    def _waiting_note(self, index: int | None, registered: dict[int, str], skipped: list[int],
                      endpoints: dict[int, str]) -> str:
        if index is not None:
            return (f"pserver slot {index} is registered by {registered.get(index)}: waiting for "
                    "its agent to release it or its lease to lapse")
        note = f"all {self.num_slots} pserver slots are taken: waiting for one to be released"
        if skipped:
            mine = f"{self.pod_ip}:{self.port}"
            why = ", ".join(f"{i} (at {endpoints[i]})" if i in endpoints
                            else f"{i} ({mine} belongs to another slot)" for i in skipped)
            note += f"; free slots this agent cannot serve: {why}"
        return note


def _check_distinct(endpoints: list[str]) -> None:
    seen: dict[str, int] = {}
    for i, endpoint in enumerate(endpoints):
        if endpoint in seen:
            raise AgentConfigError(
                f"pserver slots {seen[endpoint]} and {i} share endpoint {endpoint}: give each "
                "pserver its own POD_IP or PADDLE_PORT")
        seen[endpoint] = i
