"""Every master's presence in etcd, leader or standby: what the status page lists.

A standby writes no job state, and the leader does not know its standbys, so without
this key no page could list them. Each master puts `masters/<advertise>`
(`JobKeys.master`) on its own election session's lease when it opens that session,
and again with each new session that replaces a lost one; etcd deletes the key when
the lease lapses or is revoked, so the list is live to within the election TTL.

This key is not job state (docs/design.md section 6, invariant 4 speaks of job state): it
is written unfenced, by standbys too, and nothing that decides the job's state reads it
(a restarted master reads its predecessor's, below, to end that dead master's term).
`paddlecloud job delete` and `local train --fresh` clear it with the rest of the
job's prefix.

What this does NOT do: tell a live master from a dead one whose lease has not lapsed
yet (a SIGKILLed master stays listed up to its election TTL), or list a master between
losing a session and opening the next.

A master restarted in place (the local supervisor restarts it with the same port;
Kubernetes restarts its container in the same pod, same IP) finds the leader key naming
its own address, held on its dead predecessor's lease, and revokes that lease instead of
waiting up to an election TTL for it to lapse (`paddlecloud.etcd.Election`), when two
things prove the predecessor dead (`dead_predecessor`):
* `sole_listener_at`: this master listens at its advertised address, an IP of this
  machine, on a port of its own (its gRPC server does not share ports:
  `grpc.so_reuseport` 0), so no other live process listens there;
* the predecessor's presence, on the same lease as the leader key, names this master's
  network namespace (`network_id`: the kernel's boot id and the namespace's inode), so
  "there" is the same place: two machines (or two pods) that both advertise 127.0.0.1
  are not mistaken for one.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

import aetcd
from aetcd import rpc

from paddlecloud.keys import JobKeys, prefix_range_end

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MasterPresence:
    """One master as it announces itself."""

    advertise: str   # its --advertise address, HOST:PORT
    page: str        # its status page's URL; "" when it serves none
    started: float   # when its process started, seconds since the epoch (wall clock)
    network: str = ""  # `network_id()` of its process; "" when not known

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> MasterPresence:
        try:
            fields = json.loads(raw)
            return cls(advertise=str(fields["advertise"]), page=str(fields["page"]),
                       started=float(fields["started"]), network=str(fields.get("network", "")))
        except (ValueError, TypeError, KeyError) as error:
            raise ValueError(f"not a master's presence: {raw[:100]!r} ({error})") from None


async def announce(client: aetcd.Client, keys: JobKeys, presence: MasterPresence, *, lease: int) -> None:
    """Puts `presence` under `keys.master(advertise)` on `lease` (the master's election session's)."""
    await client.put(keys.master(presence.advertise), presence.to_json(), lease=lease)


async def read_masters(client: aetcd.Client, keys: JobKeys, *,
                       timeout: float = 5.0) -> tuple[str | None, list[MasterPresence]]:
    """The leader key's value and every master present, by address: one etcd request
    (a transaction of two reads, so both are of one revision). A value that is no
    presence is logged and left out."""
    prefix = keys.kind_prefix("masters")
    await client.connect()
    reply = await client.kvstub.Txn(
        rpc.TxnRequest(success=[
            rpc.RequestOp(request_range=rpc.RangeRequest(key=keys.leader)),
            rpc.RequestOp(request_range=rpc.RangeRequest(key=prefix, range_end=prefix_range_end(prefix))),
        ]), timeout=timeout, metadata=client.metadata)
    leader_kvs = reply.responses[0].response_range.kvs
    leader = leader_kvs[0].value.decode() if leader_kvs else None
    masters = []
    for kv in reply.responses[1].response_range.kvs:
        try:
            masters.append(MasterPresence.from_json(kv.value))
        except ValueError as error:
            logger.warning("%s: %s", kv.key.decode(errors="replace"), error)
    return leader, sorted(masters, key=lambda m: m.advertise)


_WILDCARDS = {"0.0.0.0", "::", "[::]", ""}


def sole_listener_at(advertise: str, *, host: str, port: int) -> bool:
    """True when this process, listening on `host`:`port` with a port of its own, is the
    only one that can listen at `advertise`: the same port, on an IP address (not a name:
    a name may stand for several machines) of this machine that `host` covers."""
    name, _, advertised_port = advertise.rpartition(":")
    if not advertised_port.isdigit() or int(advertised_port) != port:
        return False
    try:
        ip = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    if host not in _WILDCARDS:
        try:
            if ipaddress.ip_address(host.strip("[]")) != ip:
                return False
        except ValueError:
            return False
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((str(ip), 0))  # succeeds only for an address of this machine
        except OSError:
            return False
    return True


def network_id() -> str:
    """This process's network namespace, unique on this machine since its boot: the same
    for a container restarted in its pod, different for another machine or pod."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.stat('/proc/self/ns/net').st_ino}"
    except OSError:
        return ""  # not Linux: no predecessor is ever proved dead


async def dead_predecessor(client: aetcd.Client, keys: JobKeys, advertise: str, *,
                           network: str) -> int | None:
    """The election lease of a dead master that had `advertise` in `network` (this master's
    `network_id()`; its presence, read before this master announces its own), or None.
    Only for a master that is the sole listener at `advertise` (the module's docstring)."""
    found = await client.get(keys.master(advertise))
    if found is None or not found.lease:
        return None
    try:
        presence = MasterPresence.from_json(found.value)
    except ValueError:
        return None
    return found.lease if network and presence.network == network else None


__all__ = ["MasterPresence", "announce", "dead_predecessor", "network_id", "read_masters",
           "sole_listener_at"]
