"""Every master's presence in etcd, leader or standby: what the status page lists.

A standby writes no job state, and the leader does not know its standbys, so without
this key no page could list them. Each master puts `masters/<advertise>`
(`JobKeys.master`) on its own election session's lease when it opens that session,
and again with each new session that replaces a lost one; etcd deletes the key when
the lease lapses or is revoked, so the list is live to within the election TTL.

This key is not job state (DESIGN.md section 6, invariant 4 speaks of job state): it
is written unfenced, by standbys too, and nothing that decides the job reads it.
`paddlecloud job delete` and `local train --fresh` clear it with the rest of the
job's prefix.

What this does NOT do: tell a live master from a dead one whose lease has not lapsed
yet (a SIGKILLed master stays listed up to its election TTL), or list a master between
losing a session and opening the next.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

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

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> MasterPresence:
        try:
            fields = json.loads(raw)
            return cls(advertise=str(fields["advertise"]), page=str(fields["page"]),
                       started=float(fields["started"]))
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


__all__ = ["MasterPresence", "announce", "read_masters"]
