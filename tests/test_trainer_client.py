"""The trainer library against a real master: iteration, acks, give-backs, rejoin, failover."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter

import grpc
import pytest
from datasets import write_records
from etcd_history import done_marks, per_epoch
from masters import pb, stub, wait_serving, wait_until
from trainers import read_log, reads_per_epoch

from paddlecloud.etcd_server import free_port
from paddlecloud.keys import JobKeys
from trainer_agent.client import MasterUnavailable, TaskClient
from trainer_agent.discovery import MasterLocator


def serving(proc):
    asyncio.run(wait_serving(proc.address, process=proc))
    return proc


def client_for(proc, trainer_id: str, **kwargs) -> TaskClient:
    return TaskClient(trainer_id=trainer_id, locator=MasterLocator(master_endpoint=proc.address), **kwargs)


def tasks(proc, state) -> list:
    with grpc.insecure_channel(proc.address) as channel:
        return list(stub(channel).ListTasks(pb.ListTasksRequest(state=state, page_size=1000)).tasks)


def status(proc):
    with grpc.insecure_channel(proc.address) as channel:
        return stub(channel).GetStatus(pb.GetStatusRequest())




def all_records(files: int, per_file: int) -> Counter:
    return Counter({f"{f}-{i},{(f * 31 + i) % 97}": 1 for f in range(files) for i in range(per_file)})


def test_one_trainer_reads_every_record_once_per_epoch(tmp_path, start_master):
    write_records(tmp_path / "data", files=6, records_per_file=10)
    proc = serving(start_master("--input", str(tmp_path / "data"), "--epochs", "3", "--chunk-bytes", "64"))
    seen = {}
    with client_for(proc, "solo") as client:
        for epoch in client.epochs():
            seen[epoch.number] = Counter(epoch.records())
        stats = dict(client.stats)
    assert sorted(seen) == [0, 1, 2]
    assert all(c == all_records(6, 10) for c in seen.values())
    assert stats["accepted"] == 3 * status(proc).num_tasks and stats["stale"] == 0
    assert status(proc).phase == "Succeeded"


def test_break_gives_the_open_and_prefetched_tasks_back(tmp_path, start_master):
    write_records(tmp_path / "data", files=4, records_per_file=3)
    proc = serving(start_master("--input", str(tmp_path / "data"), "--session-ttl", "60s"))
    with client_for(proc, "quitter") as client:
        for epoch in client.epochs():
            for _ in epoch.records():
                break
            break
        # Given back at once (the lease has 60 s to go), with no failure counted.
        assert tasks(proc, pb.PENDING) == []
        assert client.stats["returned"] == 2
    todo = tasks(proc, pb.TODO)
    assert len(todo) == 4 and all(t.failures == 0 for t in todo)


def test_exception_in_user_code_gives_tasks_back_and_propagates(tmp_path, start_master):
    write_records(tmp_path / "data", files=3, records_per_file=3)
    proc = serving(start_master("--input", str(tmp_path / "data"), "--session-ttl", "60s"))
    client = client_for(proc, "clumsy")
    with pytest.raises(ZeroDivisionError):
        for epoch in client.epochs():
            for _record in epoch.records():
                1 / 0  # noqa: B018
    assert tasks(proc, pb.PENDING) == []
    assert all(t.failures == 0 for t in tasks(proc, pb.TODO))
    client.close()


def test_ctrl_c_gives_tasks_back(tmp_path, start_master, start_trainer):
    write_records(tmp_path / "data", files=3, records_per_file=50)
    proc = serving(start_master("--input", str(tmp_path / "data"), "--session-ttl", "60s"))
    log = tmp_path / "records.tsv"
    trainer = start_trainer("interrupted", master=proc.address, log=log, args=("--delay", "0.05"))
    wait_until(lambda: len(read_log(log)) >= 3, message="the trainer read nothing")
    trainer.kill(signal.SIGINT)
    assert trainer.process.returncode != 0
    assert tasks(proc, pb.PENDING) == []
    assert all(t.failures == 0 for t in tasks(proc, pb.TODO))


def test_corrupt_record_fails_its_task_and_the_rest_is_read(tmp_path, start_master):
    write_records(tmp_path / "data", files=3, records_per_file=3)
    (tmp_path / "data" / "part-00001.csv").write_text("ok-1,1\nPOISON,2\n")
    proc = serving(start_master("--input", str(tmp_path / "data"), "--max-task-failures", "1"))
    from trainer_agent.stub import parse_record
    with client_for(proc, "reader", parse=parse_record) as client:
        for epoch in client.epochs():
            list(epoch.records())
        assert client.stats["failed"] == 2  # offered max_task_failures + 1 times
        assert client.stats["accepted"] == 2
    assert status(proc).phase == "Succeeded"
    assert proc.log().count("failed: ValueError: poisoned record 'POISON,2'") == 2


def test_vanished_file_fails_its_task_naming_the_path(tmp_path, start_master):
    paths = write_records(tmp_path / "data", files=2, records_per_file=2)
    proc = serving(start_master("--input", str(tmp_path / "data"), "--max-task-failures", "0"))
    paths[0].unlink()
    with client_for(proc, "reader") as client:
        for epoch in client.epochs():
            list(epoch.records())
        assert client.stats["failed"] == 1
    assert status(proc).phase == "Succeeded"
    assert f"failed: ChunkReadError: {paths[0]}: file not found" in proc.log()


def test_unreachable_master_fails_after_the_deadline_naming_the_endpoint():
    address = f"127.0.0.1:{free_port()}"
    client = TaskClient(trainer_id="lonely", locator=MasterLocator(master_endpoint=address), deadline=2)
    with pytest.raises(MasterUnavailable, match=f"master unreachable at {address} for 2s"):
        list(client.epochs())


def test_missing_discovery_settings_are_named(monkeypatch):
    for name in ("PADDLE_MASTER_ENDPOINT", "PADDLE_ETCD_ENDPOINTS", "PADDLE_JOB_NAME"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="PADDLE_MASTER_ENDPOINT"):
        TaskClient.from_env(trainer_id="x")


def test_killed_trainer_rejoins_and_its_unacknowledged_records_are_read_again(
        tmp_path, start_master, start_trainer, etcd_endpoint, job_name):
    write_records(tmp_path / "data", files=6, records_per_file=50)
    proc = serving(start_master("--input", str(tmp_path / "data"), "--epochs", "3", "--chunk-bytes", "300",
                                "--session-ttl", "3s"))
    log = tmp_path / "records.tsv"
    common = dict(etcd=etcd_endpoint, job=job_name, log=log, args=("--delay", "0.005"))
    trainers = [start_trainer(f"t{i}", **common) for i in range(3)]
    victim = trainers[0]
    wait_until(lambda: sum(1 for e, t, _, _ in read_log(log) if t == "t0" and e == 1) >= 5,
               message="t0 never reached epoch 1")
    victim.kill()
    cut = read_log(log)
    last_task = cut[max(i for i, row in enumerate(cut) if row[1] == "t0")][2]
    unacked = {r for e, t, task, r in cut if t == "t0" and e == 1 and task == last_task}
    start_trainer("t0", **common)  # rejoins with the same id
    for t in trainers[1:]:
        assert t.wait() == 0, t.output_text()
    rows = read_log(log)
    reads = reads_per_epoch(rows)
    assert sorted(reads) == [0, 1, 2]
    for epoch in reads.values():
        assert set(epoch) == set(all_records(6, 50))  # every record read at least once per epoch
    # What t0 had read of its open task when it died was read again.
    again = Counter(r for e, _, _, r in rows if e == 1 and r in unacked)
    assert unacked and all(again[r] >= 2 for r in unacked)
    counted = per_epoch(asyncio.run(done_marks(etcd_endpoint, JobKeys("local", job_name))))
    num_tasks = status(proc).num_tasks
    assert {e: sorted(c) for e, c in counted.items()} == {e: list(range(num_tasks)) for e in range(3)}
    assert all(max(c.values()) == 1 for c in counted.values())


def test_two_processes_with_one_trainer_id_the_older_stops(tmp_path, start_master, start_trainer):
    write_records(tmp_path / "data", files=4, records_per_file=40)
    proc = serving(start_master("--input", str(tmp_path / "data"), "--chunk-bytes", "200"))
    log = tmp_path / "records.tsv"
    older = start_trainer("same", master=proc.address, log=log, args=("--delay", "0.01"))
    wait_until(lambda: len(read_log(log)) >= 3, message="the first process read nothing")
    newer = start_trainer("same", master=proc.address, log=log, args=("--delay", "0.001"))
    assert older.wait() == 4
    assert "superseded by a newer session of trainer same" in older.output_text()
    assert "another process uses this trainer id" in older.output_text()
    assert newer.wait() == 0, newer.output_text()
    assert status(proc).phase == "Succeeded"


def test_master_killed_and_restarted_while_trainers_run(tmp_path, start_master, start_trainer,
                                                         etcd_endpoint, job_name):
    write_records(tmp_path / "data", files=6, records_per_file=30)
    args = ("--input", str(tmp_path / "data"), "--epochs", "2", "--chunk-bytes", "200")
    first = serving(start_master(*args))
    log = tmp_path / "records.tsv"
    trainers = [start_trainer(f"t{i}", master=first.address, log=log, args=("--delay", "0.005"))
                for i in range(2)]
    wait_until(lambda: len(read_log(log)) >= 40, message="no progress before the kill")
    first.kill()
    second = serving(start_master(*args, port=first.port))
    for t in trainers:
        assert t.wait() == 0, t.output_text()
    assert status(second).phase == "Succeeded"
    counted = per_epoch(asyncio.run(done_marks(etcd_endpoint, JobKeys("local", job_name))))
    num_tasks = status(second).num_tasks
    assert {e: sum(c.values()) for e, c in counted.items()} == {0: num_tasks, 1: num_tasks}
    assert all(max(c.values()) == 1 for c in counted.values())
    reads = reads_per_epoch(read_log(log))
    assert all(set(c) == set(all_records(6, 30)) for c in reads.values())


def test_save_model_is_granted_to_one_trainer_at_a_time(tmp_path, start_master):
    write_records(tmp_path / "data", files=1, records_per_file=1)
    proc = serving(start_master("--input", str(tmp_path / "data")))
    with client_for(proc, "a") as a, client_for(proc, "b") as b:
        a.register()
        b.register()
        assert a.request_save_model(block=30) is True
        assert b.request_save_model(block=30) is False
        assert a.request_save_model(block=30) is True  # the holder may ask again


def test_moving_to_another_leader_keeps_calls_on_the_old_channel_alive(tmp_path, start_master):
    # The keep-alive and prefetch threads may be mid-call when another thread follows a
    # leader hint: the old channel must not be closed under them (it was: CANCELLED).
    from trainer_agent.client import MasterConnection

    write_records(tmp_path / "data", files=1, records_per_file=1)
    proc = serving(start_master("--input", str(tmp_path / "data")))
    connection = MasterConnection(MasterLocator(master_endpoint=proc.address), deadline=5)
    try:
        in_use = connection._connect(proc.address)
        connection._connect(f"127.0.0.1:{free_port()}")  # another thread moves on
        assert in_use.GetStatus(pb.GetStatusRequest(), timeout=5).phase == "Running"
    finally:
        connection.close()
