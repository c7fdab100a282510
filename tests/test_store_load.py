"""Loading a job late in a big epoch: the done marks are read in many small ranges (etcd 3.4
walks the rest of a range for every page it answers), and none is missed or read twice; each
range's keys are found in the bytes etcd sent (`paddlecloud.etcd.read_key_numbers`)."""

from __future__ import annotations

import pytest

from master import snapshot as snapshot_module
from master.store import EtcdStore
from paddlecloud import etcd
from paddlecloud.etcd import ranges, read_key_numbers
from paddlecloud.keys import JobKeys, prefix_range_end


@pytest.mark.parametrize("done_range", [10_000, 7, 1])
async def test_every_done_mark_of_the_current_epoch_is_read_once_whatever_the_ranges(
        etcd_endpoint, job_name, monkeypatch, done_range):
    monkeypatch.setattr(snapshot_module, "DONE_RANGE", done_range)
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


@pytest.fixture
async def client(etcd_endpoint):
    connected = await etcd.connect(etcd_endpoint)
    yield connected
    await connected.close()


async def _put_all(client, keys: list[bytes]) -> int:
    for key in keys:
        await client.put(key, b"")
    return (await client.get(keys[-1])).mod_revision


async def test_the_numbers_of_every_key_in_pages_at_one_revision(client, job_name, monkeypatch):
    monkeypatch.setattr(ranges, "READ_PAGE", 7)  # many pages
    base = JobKeys("local", job_name).kind_prefix("done", 0)
    numbers = [0, 5, 9, 10, 42, 99, 100, 123, 4567, 1_000_000, *range(200, 240)]
    revision = await _put_all(client, [base + b"%d" % n for n in numbers])
    await client.put(base + b"77", b"")  # after the revision: not seen
    await client.put(JobKeys("local", job_name).kind_prefix("done", 1) + b"3", b"")  # another epoch
    found = await read_key_numbers(client, base, base, prefix_range_end(base), revision=revision)
    assert sorted(found) == sorted(numbers)


async def test_a_key_that_is_no_number_is_an_error_naming_it(client, job_name):
    base = JobKeys("local", job_name).kind_prefix("done", 0)
    revision = await _put_all(client, [base + b"1", base + b"12x", base + b"2"])
    with pytest.raises(ValueError, match=r"etcd key b'.*/done/0/12x' is not"):
        await read_key_numbers(client, base, base, prefix_range_end(base), revision=revision)
