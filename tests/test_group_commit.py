"""The group committer against a real etcd: big bursts, failed compares, the fence."""

from __future__ import annotations

import asyncio

import pytest

from master.committer import GroupCommitter, put, value_is, version_is
from master.store_errors import NotLeader
from paddlecloud import etcd


@pytest.fixture
async def leading(etcd_endpoint, job_name):
    client = await etcd.connect(etcd_endpoint)
    session = await etcd.Session(client, ttl=10).open()
    leadership = await etcd.Election(session, f"/bench-test/{job_name}/leader".encode()).campaign("me")
    yield client, leadership, f"/bench-test/{job_name}/".encode()
    await session.close()
    await client.close()


async def test_a_burst_wider_than_max_txn_ops_commits_in_several_requests(leading):
    """etcd checks a nested txn against what the outer one leaves of --max-txn-ops (128):
    300 writes of 4 compares each must be split so that batch + 4 <= 128."""
    client, leadership, prefix = leading
    committer = GroupCommitter(client, leadership)
    committer.start()
    try:
        futures = [
            committer.submit([version_is(prefix + f"k/{i}".encode(), 0)] * 3
                             + [version_is(prefix + b"absent", 0)],
                             [put(prefix + f"k/{i}".encode(), "v")], frozenset([prefix + f"k/{i}".encode()]))
            for i in range(300)
        ]
        revisions = await asyncio.wait_for(asyncio.gather(*futures), 30)
        assert all(r is not None for r in revisions)
        assert committer.writes == 300 and committer.batches >= 3
    finally:
        await committer.stop()


async def test_one_failed_compare_fails_only_its_own_write(leading):
    client, leadership, prefix = leading
    committer = GroupCommitter(client, leadership)
    committer.start()
    try:
        await client.put(prefix + b"x", b"1")
        futures = [committer.submit([value_is(prefix + b"x", "1" if i != 5 else "2")],
                                    [put(prefix + f"y/{i}".encode(), "v")]) for i in range(10)]
        results = await asyncio.gather(*futures)
        assert [r is None for r in results] == [i == 5 for i in range(10)]
    finally:
        await committer.stop()


async def test_a_write_on_a_lapsed_lease_is_refused_alone_and_the_batch_commits(leading):
    """etcd refuses a whole request when one of its writes puts a key on a lease that is gone
    (no compare can test a lease): the others must still commit, that write alone refused."""
    client, leadership, prefix = leading
    gone = [(await client.lease(10)).id for _ in range(2)]
    for lease in gone:
        await client.revoke_lease(lease)
    live = (await client.lease(10)).id
    committer = GroupCommitter(client, leadership)
    committer.start()
    try:
        bad = {3: gone[0], 7: gone[1]}
        futures = [committer.submit([], [put(prefix + f"w/{i}".encode(), "v", lease=bad.get(i, live))])
                   for i in range(10)]  # queued before the committer runs: one batch
        results = await asyncio.wait_for(asyncio.gather(*futures), 30)
        assert [r is None for r in results] == [i in bad for i in range(10)]
        written = {kv.key for kv in await client.get_prefix(prefix + b"w/")}
        assert written == {prefix + f"w/{i}".encode() for i in range(10) if i not in bad}
    finally:
        await committer.stop()
        await client.revoke_lease(live)


async def test_a_stopped_committer_refuses_writes(leading):
    client, leadership, prefix = leading
    committer = GroupCommitter(client, leadership)
    committer.start()
    await committer.stop()
    with pytest.raises(NotLeader):
        await committer.commit([], [put(prefix + b"z", "v")])


def test_the_hot_paths_build_the_same_requests_as_the_generic_builders():
    """The transactions of TaskAssigned and TaskFinished are built in place, from cached key
    prefixes: byte for byte what the plain compare/op helpers give."""
    import json

    from master.committer import delete, mod_revision_is, nested_txn
    from master.machine import MasterMachine
    from master.state import Assignment, JobState, TaskAssigned, TaskFinished
    from master.transactions import Transactions, encode_assignment
    from paddlecloud.keys import JobKeys

    k = JobKeys("local", "job-x")
    store = Transactions(k)
    for a, epoch, task in [(Assignment(7587890123456, "t-12", 0, 1790000000.125), 3, 17),
                           (Assignment(1, 'we"ird\u00e9', 0, 0.0), 0, 0)]:
        state = MasterMachine(max_failures=3)
        state.tasks = JobState.new(num_tasks=20, num_epochs=5, seed=0, max_failures=3, epoch=epoch)
        value = json.dumps({"session": a.session, "trainer": a.trainer, "epoch": epoch,
                            "deadline": a.deadline}, separators=(",", ":")).encode()
        assert encode_assignment(a, epoch) == value
        built = store.txn_for(TaskAssigned(task, a), state)
        expected = nested_txn(
            [value_is(k.trainer(a.trainer), str(a.session)), version_is(k.assign(task), 0),
             version_is(k.done(epoch, task), 0), value_is(k.epoch, str(epoch))],
            [put(k.assign(task), value, lease=a.session)])
        assert built.op.SerializeToString() == expected.SerializeToString()
        assert (built.width, built.keys, built.exclusive) == (4, frozenset([k.assign(task)]), False)
        built = store.txn_for(TaskFinished(task, 123456), state)
        expected = nested_txn([mod_revision_is(k.assign(task), 123456), version_is(k.done(epoch, task), 0)],
                              [put(k.done(epoch, task), ""), delete(k.assign(task))])
        assert built.op.SerializeToString() == expected.SerializeToString()
        assert (built.width, built.keys, built.exclusive) == (2, frozenset([k.assign(task), k.done(epoch, task)]), False)
