"""The master's one handle on the job's keys in etcd, assembled from the parts that do
each job: writes through the fenced group committer (`master.committer`), an event's
write built by `master.transactions`, the snapshot a cache is rebuilt from
(`master.snapshot`), and the trainers' leases (`master.leases`); plus the few reads
and the watch the rooms need (the pservers, the save-model grant, the leader key, the
trainer keys that end).

What this does NOT do: decide anything. The rooms decide from the machine
(`master.machine`); this module only makes etcd agree, or says it did not.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

import aetcd

from master import snapshot
from master.committer import Answered, GroupCommitter, Txn, put
from master.leases import TrainerLeases
from master.machine import Durable, MasterMachine, Snapshot
from master.partition import FileEntry
from master.snapshot import MarkMirror
from master.store_errors import NotLeader, etcd_answers
from master.transactions import Transactions
from paddlecloud.etcd import Leadership, LeaseKeeper, read_range
from paddlecloud.keys import JobKeys, prefix_range_end


class EtcdStore:
    def __init__(self, client: aetcd.Client, keys: JobKeys, leadership: Leadership, *,
                 keeper: LeaseKeeper | None = None) -> None:
        self.client = client
        self.keys = keys
        self.leadership = leadership
        self.committer = GroupCommitter(client, leadership)
        self.transactions = Transactions(keys)
        # the trainers' leases; the master refreshes them from a process of its own
        # (paddlecloud.lease_process, closed by whoever gave it), else on this loop
        self.leases = TrainerLeases(client, keeper)

    async def start(self) -> None:
        self.committer.start()
        self.leases.start()

    async def stop(self) -> None:
        await self.committer.stop()
        await self.leases.stop()

    # -- writes --

    def submit(self, event: Durable, machine: MasterMachine,
               then: Answered | None = None) -> asyncio.Future[int | None]:
        """Queues `event`'s transaction; resolves to the revision, or None if a compare failed
        (`then`: as `GroupCommitter.submit_txn`)."""
        return self.committer.submit_txn(self.transactions.txn_for(event, machine), then)

    async def _all(self, txns: Iterable[Txn]) -> bool:
        """Commits `txns` one after another; False at the first refused (the rest not sent)."""
        for txn in txns:
            if await self.committer.submit_txn(txn) is None:
                return False
        return True

    async def stage_files(self, files: list[FileEntry]) -> bool:
        """Writes a dataset's file list before its adoption (`DatasetAdopted`) freezes it;
        False if a spec was frozen meanwhile."""
        return await self._all(self.transactions.file_list_txns(files))

    async def restart_marks(self, epoch: int, done: tuple[int, ...], *, revision: int) -> bool:
        """Writes the done marks of a bigger restart committed at `revision`, then deletes its
        marker; False when the marker is no longer that restart's (nothing more written).
        Until the marker is gone, the load takes its list as the epoch's done tasks: a
        master that dies half-way leaves the restarted epoch, consistent."""
        return await self._all(self.transactions.restart_mark_txns(epoch, done, revision=revision))

    async def set_goodput(self, figures: str) -> None:
        """The goodput figures (`master.goodput`): accounting, not the job's state."""
        await self.committer.submit_txn(Txn.of([], [put(self.keys.goodput, figures)], (self.keys.goodput,)))

    async def goodput(self) -> bytes | None:
        """The goodput figures the job's last leader wrote (master.goodput), None before any."""
        with etcd_answers("the goodput figures"):
            found = await self.client.get(self.keys.goodput)
        return found.value if found is not None else None

    # -- reading --

    async def load(self, mirror: MarkMirror | None = None) -> Snapshot:
        """The job's keys at one revision (`master.snapshot.load`)."""
        return await snapshot.load(self.client, self.keys, self.leadership, mirror)

    async def pservers(self) -> list[str]:
        """The registered pservers' endpoints, by index."""
        prefix = self.keys.kind_prefix("pservers")
        with etcd_answers("the pservers"):
            kvs, _ = await read_range(self.client, prefix, prefix_range_end(prefix))
        return [kv.value.decode() for kv in sorted(kvs, key=lambda kv: self.keys.task_of(kv.key))]

    async def save_model_holder(self) -> str | None:
        """The trainer that holds the save-model grant, if one does."""
        with etcd_answers("the save-model grant"):
            current = await self.client.get(self.keys.save_model)
        return current.value.decode() if current is not None else None

    async def confirm_leadership(self) -> None:
        """Raises NotLeader (naming the leader when one is known) unless our leadership stands."""
        with etcd_answers("the leader key"):
            current = await self.client.get(self.keys.leader)
        if current is None or current.create_revision != self.leadership.create_revision:
            raise NotLeader(current.value.decode() if current is not None else None)

    async def ended_sessions(self, start_revision: int) -> AsyncIterator[int]:
        """The sessions whose `trainers/<id>` key etcd deletes from `start_revision` on
        (a lease lapsed or was revoked), as they go."""
        prefix = self.keys.kind_prefix("trainers")
        watch = await self.client.watch(prefix, range_end=prefix_range_end(prefix),
                                        start_revision=start_revision, prev_kv=True)
        async for event in watch:
            if event.kind == "DELETE" and event.prev_kv is not None:
                yield int(event.prev_kv.value)
