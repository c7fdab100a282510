"""The standby's copy of the done marks (`master.mirror`): read once, then followed through
etcd's changes, and exact as of the election it is asked about; the first load after an
election takes it instead of reading the marks. Against a real etcd."""

from __future__ import annotations

import logging

import pytest
from waiting import wait_for

from master import mirror as mirror_module
from master.mirror import DoneMarkMirror
from master.store import EtcdStore
from paddlecloud import etcd
from paddlecloud.keys import JobKeys


@pytest.fixture
async def client(etcd_endpoint):
    connected = await etcd.connect(etcd_endpoint)
    yield connected
    await connected.close()


@pytest.fixture
async def mirror(client, job_name):
    followed = DoneMarkMirror(client, JobKeys("local", job_name))
    yield followed
    await followed.stop()


async def put_marks(client, keys: JobKeys, epoch: int, tasks) -> None:
    tasks = list(tasks)
    for first in range(0, len(tasks), 100):
        await client.transaction(compare=[], success=[
            client.transactions.put(keys.done(epoch, t), b"") for t in tasks[first:first + 100]],
            failure=[])


async def elect(client, keys: JobKeys) -> tuple[etcd.Session, etcd.Leadership]:
    """A real campaign: the leader key's PUT is the revision the mirror must reach."""
    session = await etcd.Session(client, ttl=10).open()
    return session, await etcd.Election(session, keys.leader).campaign("127.0.0.1:1")


async def following(mirror: DoneMarkMirror) -> None:
    await wait_for(lambda: mirror.revision > 0, message="the mirror never followed the marks")


async def test_the_mirror_holds_the_marks_read_and_every_change_up_to_the_election(
        client, job_name, mirror):
    keys = JobKeys("local", job_name)
    await client.put(keys.epoch, b"2")
    await put_marks(client, keys, 2, range(0, 300, 2))
    mirror.start()
    await following(mirror)
    # the leader goes on: more marks, a restart's deletes, then the next epoch
    await put_marks(client, keys, 2, range(1, 300, 2))
    await client.delete_range(keys.done(2, 100), keys.done(2, 200))  # by the keys' order
    await client.put(keys.failures(2, 7), b"1")  # in the watched range, not a mark
    session, leadership = await elect(client, keys)
    try:
        marks = await mirror.marks(2, revision=leadership.create_revision)
        snap = await EtcdStore(client, keys, leadership).load()  # read from etcd, for comparison
    finally:
        await session.close()
    assert marks is not None and sorted(marks) == sorted(snap.done)
    assert sorted(marks) == [t for t in range(300) if not "100" <= str(t) < "200"]  # etcd's order
    assert await mirror.marks(3, revision=leadership.create_revision) == []


async def test_the_first_load_after_the_election_takes_the_mirror_and_says_so(
        client, job_name, mirror):
    keys = JobKeys("local", job_name)
    await client.put(keys.epoch, b"0")
    await put_marks(client, keys, 0, range(50))
    mirror.start()
    await following(mirror)
    await put_marks(client, keys, 0, range(50, 80))
    session, leadership = await elect(client, keys)
    try:
        store = EtcdStore(client, keys, leadership)
        mirrored, read = await store.load(mirror), await store.load()
    finally:
        await session.close()
    assert mirrored.mirrored and not read.mirrored
    assert sorted(mirrored.done) == sorted(read.done) == list(range(80))


async def test_a_mirror_behind_the_election_answers_none_and_the_load_reads_etcd(
        client, job_name, mirror):
    keys = JobKeys("local", job_name)
    await client.put(keys.epoch, b"0")
    await put_marks(client, keys, 0, range(5))
    assert await mirror.marks(0, revision=1) is None  # not started: not following
    mirror.start()
    await following(mirror)
    far = mirror.revision + 1000  # a revision etcd has not reached: never caught up
    assert await mirror.marks(0, revision=far, timeout=0.2) is None
    session, leadership = await elect(client, keys)
    try:
        leadership = etcd.Leadership(keys.leader, far)
        snap = await EtcdStore(client, keys, leadership).load(mirror)
    finally:
        await session.close()
    assert not snap.mirrored and sorted(snap.done) == list(range(5))


async def test_marks_outside_the_epoch_or_a_key_of_another_shape_stop_the_mirror_until_gone(
        client, job_name, mirror, monkeypatch, caplog):
    monkeypatch.setattr(mirror_module, "RETRY_FIRST", 0.05)
    monkeypatch.setattr(mirror_module, "RETRY_MAX", 0.05)
    caplog.set_level(logging.INFO, logger="master.mirror")
    keys = JobKeys("local", job_name)
    await client.put(keys.epoch, b"1")
    await put_marks(client, keys, 1, range(3))
    await client.put(keys.done(0, 9), b"")  # a mark the epoch's read would not see
    mirror.start()
    await wait_for(lambda: "1 done marks outside epoch 1" in caplog.text,
                   message="the mirror did not refuse a mark of another epoch")
    assert mirror.revision == 0 and await mirror.marks(1, revision=1) is None
    await client.delete(keys.done(0, 9))
    await following(mirror)
    await client.put(keys.kind_prefix("done") + b"1/x", b"")
    await wait_for(lambda: "invalid literal for int()" in caplog.text,
                   message="the mirror applied a key that is no mark")
    await client.delete(keys.kind_prefix("done") + b"1/x")
    await following(mirror)
    session, leadership = await elect(client, keys)
    try:
        assert sorted(await mirror.marks(1, revision=leadership.create_revision)) == [0, 1, 2]
    finally:
        await session.close()
