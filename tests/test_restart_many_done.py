"""RestartEpoch with more done tasks than one etcd transaction holds (--max-txn-ops 128).

The restart's own transaction lists them in a marker; their marks follow in fenced
writes; a master that starts while the marker is there (its predecessor died half-way)
takes the marker's list as the epoch's done tasks.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from datasets import write_records
from etcd_history import check_exactly_once, mark_history
from masters import pb, wait_serving
from test_master_tasks import channel_to, run_trainer  # noqa: F401 (a fixture)

from master.transactions import MAX_RESTART_DONE, RESTART_MARKS_PER_TXN
from paddlecloud.etcd import connect
from paddlecloud.keys import JobKeys

TASKS = 300
DONE = tuple(range(0, TASKS, 2)) + (1,)  # 151: more than one transaction's worth, and its follow-ups'


async def done_marks(endpoint: str, keys: JobKeys, epoch: int) -> set[int]:
    async with await connect(endpoint) as client:
        base = keys.kind_prefix("done", epoch)
        found = await client.get_prefix(base)
        return {int(kv.key[len(base):]) for kv in found}


async def marker(endpoint: str, keys: JobKeys) -> bytes | None:
    async with await connect(endpoint) as client:
        kv = await client.get(keys.kind_prefix("restart") + b"done")
        return None if kv is None else kv.value


def test_the_list_is_bigger_than_one_transaction_and_than_one_follow_up():
    assert len(DONE) > MAX_RESTART_DONE and len(DONE) > RESTART_MARKS_PER_TXN


@pytest.mark.timeout(120)
async def test_a_restart_with_many_done_tasks_deals_only_the_others(
        tmp_path, start_master, channel_to, etcd_endpoint, job_name):  # noqa: F811
    write_records(tmp_path / "data", files=TASKS, records_per_file=1)
    proc = start_master("--input", str(tmp_path / "data"), "--epochs", "2")
    await wait_serving(proc.address, process=proc)
    master = await channel_to(proc.address)
    keys = JobKeys("local", job_name)
    assert (await master.RestartEpoch(pb.RestartEpochRequest(epoch=0, done_tasks=DONE))).current_epoch == 0
    status = await master.GetStatus(pb.GetStatusRequest())
    assert (status.counts.done, status.counts.todo) == (len(DONE), TASKS - len(DONE))
    assert await done_marks(etcd_endpoint, keys, 0) == set(DONE)  # every mark written
    assert await marker(etcd_endpoint, keys) is None              # and the marker gone
    accepted: Counter = Counter()
    await asyncio.wait_for(run_trainer(master, "t", accepted=accepted), 90)
    assert sorted(t for e, t in accepted if e == 0) == sorted(set(range(TASKS)) - set(DONE))
    assert sorted(t for e, t in accepted if e == 1) == list(range(TASKS))
    events = [(m.kind, m.epoch, m.task) for m in await mark_history(etcd_endpoint, keys, "done")]
    check_exactly_once(events, num_tasks=TASKS, num_epochs=2)


@pytest.mark.timeout(120)
async def test_a_master_finding_a_half_written_restart_takes_the_marker_s_list(
        tmp_path, start_master, channel_to, etcd_endpoint, job_name):  # noqa: F811
    write_records(tmp_path / "data", files=TASKS, records_per_file=1)
    first = start_master("--input", str(tmp_path / "data"), "--epochs", "1")
    await wait_serving(first.address, process=first)
    first.stop()
    # What the restart's own transaction leaves before its marks are written: the epoch,
    # no mark, the marker with the list; and one follow-up write's marks.
    keys = JobKeys("local", job_name)
    async with await connect(etcd_endpoint) as client:
        await client.delete_prefix(keys.kind_prefix("done"))
        await client.put(keys.kind_prefix("restart") + b"done",
                         json.dumps({"epoch": 0, "done": list(DONE)}).encode())
        for task in DONE[:10]:
            await client.put(keys.done(0, task), b"")
    second = start_master("--input", str(tmp_path / "data"), "--epochs", "1")
    await wait_serving(second.address, process=second)
    master = await channel_to(second.address)
    status = await master.GetStatus(pb.GetStatusRequest())
    assert (status.counts.done, status.counts.todo) == (len(DONE), TASKS - len(DONE))
    accepted: Counter = Counter()
    await asyncio.wait_for(run_trainer(master, "t", accepted=accepted), 90)
    assert sorted(t for e, t in accepted if e == 0) == sorted(set(range(TASKS)) - set(DONE))
    assert await marker(etcd_endpoint, keys) is None  # the epoch's end took it away
