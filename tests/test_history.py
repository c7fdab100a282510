"""The exactly-once arithmetic over a job's done marks (`tests/etcd_history.py` `audit_done_marks`),
on hand-written histories, and the replay of one from a real etcd: what the tests, the chaos
audit and the fault benchmark rely on."""

from __future__ import annotations

import pytest
from etcd_history import MarkEvent, audit_done_marks


def put(epoch: int, task: int) -> MarkEvent:
    return MarkEvent("PUT", epoch, task)


def delete(epoch: int, task: int) -> MarkEvent:
    return MarkEvent("DELETE", epoch, task)


def epoch_of(epoch: int, tasks: int) -> list[MarkEvent]:
    """One clean epoch: every task marked once, then the marks cleared at its end."""
    return [put(epoch, t) for t in range(tasks)] + [delete(epoch, t) for t in range(tasks)]


@pytest.mark.unit
def test_clean_epochs_count_every_task_once():
    audit = audit_done_marks(epoch_of(0, 3) + epoch_of(1, 3), epochs=2, tasks=3)
    assert audit.double_counted == ()
    assert audit.passes == {0: {0, 1, 2}, 1: {0, 1, 2}}
    assert audit.lost == {} and audit.lost_count == 0


@pytest.mark.unit
def test_a_mark_put_again_while_it_lives_is_double_counted():
    history = [put(0, 0), put(0, 1), put(0, 1), put(0, 2)] + [delete(0, t) for t in range(3)]
    audit = audit_done_marks(history, epochs=1, tasks=3)
    assert audit.double_counted == ((0, 1),)


@pytest.mark.unit
def test_a_restarted_unfinished_pass_does_not_count_and_the_next_must():
    restarted = [put(0, 0), put(0, 1), delete(0, 0), delete(0, 1)]  # RestartEpoch cleared them
    assert audit_done_marks(restarted + epoch_of(0, 3), epochs=1, tasks=3).passes == {0: {0, 1, 2}}
    audit = audit_done_marks(restarted, epochs=1, tasks=3)
    assert audit.passes == {}
    assert audit.lost == {0: {0, 1, 2}} and audit.lost_count == 3


@pytest.mark.unit
def test_an_epoch_cleared_without_a_task_is_not_a_pass_unless_the_task_failed():
    history = [put(0, 0), put(0, 1), delete(0, 0), delete(0, 1)]
    assert audit_done_marks(history, epochs=1, tasks=3).lost == {0: {0, 1, 2}}
    failed = audit_done_marks(history, epochs=1, tasks=3, failed=[(0, 2)])
    assert failed.lost == {} and failed.passes == {0: {0, 1}}


@pytest.mark.unit
def test_without_a_task_count_every_task_seen_is_expected_in_every_epoch():
    history = epoch_of(0, 3) + [put(1, 0), put(1, 1), delete(1, 0), delete(1, 1)]
    audit = audit_done_marks(history, epochs=2, failed=[(1, 2)])
    assert audit.lost == {} and sorted(audit.passes) == [0, 1]
    assert audit_done_marks(history, epochs=2).lost == {1: {0, 1, 2}}


@pytest.mark.unit
def test_a_piece_of_a_split_task_is_no_task_a_pass_must_count():
    """Work stealing split task 2 in epoch 0 (its rest is piece 3) and nothing in epoch 1: both
    are complete, and the piece is no task epoch 1 lost."""
    split = [put(0, 0), put(0, 3), put(0, 2), put(0, 1)] + [delete(0, t) for t in range(4)]
    history = split + epoch_of(1, 3)
    assert sorted(audit_done_marks(history, epochs=2).passes) == [0]  # without knowing the piece
    audit = audit_done_marks(history, epochs=2, pieces=[3])
    assert audit.lost == {} and audit.passes == {0: {0, 1, 2, 3}, 1: {0, 1, 2}}


async def test_piece_ids_are_the_units_whose_extent_names_another_root(etcd_endpoint, job_name):
    """`piece_ids` reads them from the `extents/` history, as the master writes a split: the
    cut task's extent names itself, the piece's its root."""
    from etcd_history import piece_ids

    from master.transactions import encode_extent
    from paddlecloud import etcd
    from paddlecloud.keys import JobKeys

    keys = JobKeys("local", job_name)
    client = await etcd.connect(etcd_endpoint)
    try:
        await client.put(keys.extent(0, 2), encode_extent(2, 0, 40))
        await client.put(keys.extent(0, 8), encode_extent(2, 40, 90))
        await client.delete(keys.extent(0, 8))  # an epoch's end clears them: history keeps them
    finally:
        await client.close()
    assert await piece_ids(etcd_endpoint, keys) == {8}


async def test_a_history_larger_than_one_grpc_message_is_read_whole(etcd_endpoint, job_name):
    """A watch that catches up sends up to 1,000 revisions in one message: 50 transactions of
    100 marks of 1 KiB (a master's large group commits) are 5 MB in one, past gRPC's default
    4 MiB, and the replay still reads every mark."""
    from etcd_history import mark_history

    from paddlecloud import etcd
    from paddlecloud.keys import JobKeys

    keys = JobKeys("local", job_name)
    client = await etcd.connect(etcd_endpoint)
    try:
        start = (await client.put(keys.kind_prefix("start"), b"")).header.revision + 1
        for batch in range(50):
            puts = [client.transactions.put(keys.kind_prefix("done") + f"0/{batch * 100 + i}".encode(), b"x" * 1024)
                    for i in range(100)]
            await client.transaction(compare=[], success=puts, failure=[])
    finally:
        await client.close()
    history = await mark_history(etcd_endpoint, keys, "done", start_revision=start)
    assert [(e.kind, e.epoch, e.task) for e in history] == [("PUT", 0, t) for t in range(5000)]
