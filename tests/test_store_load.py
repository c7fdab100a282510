"""Loading a job late in a big epoch: the done marks are read in many small ranges (etcd 3.4
walks the rest of a range for every page it answers), and none is missed or read twice."""

from __future__ import annotations

import pytest

from master import store as store_module
from master.store import EtcdStore
from paddlecloud import etcd
from paddlecloud.keys import JobKeys


@pytest.mark.parametrize("done_range", [10_000, 7, 1])
async def test_every_done_mark_of_the_current_epoch_is_read_once_whatever_the_ranges(
        etcd_endpoint, job_name, monkeypatch, done_range):
    monkeypatch.setattr(store_module, "DONE_RANGE", done_range)
    keys = JobKeys("local", job_name)
    client = await etcd.connect(etcd_endpoint)
    try:
        marked = [t for t in range(1234) if t % 3]  # ids of 1 to 4 digits
        await client.put(keys.epoch, b"2")
        for first in range(0, len(marked), 100):
            await client.transaction(compare=[], success=[
                client.transactions.put(keys.done(2, t), b"") for t in marked[first:first + 100]], failure=[])
        await client.put(keys.done(1, 5), b"")  # another epoch's mark: not this epoch's
        await client.put(keys.failures(2, 4), b"2")
        snap = await EtcdStore(client, keys, etcd.Leadership(keys.leader, 1)).load()
    finally:
        await client.close()
    assert snap.epoch == 2
    assert sorted(snap.done) == marked and len(snap.done) == len(marked)
    assert snap.failures == {4: 2}
