"""The trainer library against a real master: iteration, acks, give-backs, rejoin, failover."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass

import grpc
import pytest
from datasets import write_records
from etcd_history import done_marks, per_epoch
from google.rpc import status_pb2
from masters import metric, pb, stub, wait_serving, wait_until
from trainers import read_log, reads_per_epoch

from paddlecloud.etcd_server import free_port
from paddlecloud.keys import JobKeys
from paddlecloud.master_client.discovery import DiscoveryError, MasterLocator
from paddlecloud.wire import Reason, error_info
from trainer_agent.client import (
    MasterConnection,
    MasterUnavailable,
    Session,
    TaskClient,
    TrainerSuperseded,
)


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


def started_reading(start_trainer, trainer_id: str, *, master: str, log, delay: str):
    """A stub trainer process, once it has read a few records."""
    trainer = start_trainer(trainer_id, master=master, log=log, args=("--delay", delay))
    wait_until(lambda: len(read_log(log)) >= 3, message=f"trainer {trainer_id} read nothing")
    return trainer


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


def test_a_fetch_in_flight_that_fails_at_a_break_is_logged(tmp_path, start_master, caplog):
    """The loop's end waits for the prefetch in flight to give its task back; when that fetch
    failed, the exit goes on (the task returns with the lease) and the log says why."""
    import concurrent.futures
    write_records(tmp_path / "data", files=4, records_per_file=3)
    proc = serving(start_master("--input", str(tmp_path / "data"), "--session-ttl", "60s"))
    with client_for(proc, "unlucky") as client:
        real_fetch, calls = client.fetch, []

        def fetch(epoch):  # the first fetch is real; the prefetch after it fails
            calls.append(epoch)
            if len(calls) == 1:
                return real_fetch(epoch)
            failed = concurrent.futures.Future()
            failed.set_exception(MasterUnavailable("the master went away mid-fetch"))
            return failed

        client.fetch = fetch
        with caplog.at_level("WARNING", logger="trainer_agent.client"):
            for epoch in client.epochs():
                for _ in epoch.records():
                    break
                break
    assert len(calls) >= 2, f"no prefetch was in flight at the break: {calls}"
    assert any("fetch in flight" in r.getMessage() and "the master went away" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


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
    trainer = started_reading(start_trainer, "interrupted", master=proc.address,
                              log=tmp_path / "records.tsv", delay="0.05")
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


@pytest.mark.unit
def test_missing_discovery_settings_are_named(monkeypatch):
    for name in ("PADDLE_MASTER_ENDPOINT", "PADDLE_ETCD_ENDPOINTS", "PADDLE_JOB_NAME"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="PADDLE_MASTER_ENDPOINT"):
        TaskClient.from_env(trainer_id="x")


@pytest.mark.unit
def test_a_deadline_that_is_no_number_is_named(monkeypatch):
    monkeypatch.setenv("PADDLE_MASTER_ENDPOINT", "127.0.0.1:1")
    monkeypatch.setenv("PADDLECLOUD_MASTER_DEADLINE", "5 minutes")
    with pytest.raises(ValueError, match="PADDLECLOUD_MASTER_DEADLINE='5 minutes' is not a number"):
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
    # Both read slowly enough that the older's next call (within a task of ~1 s) comes while
    # the newer still runs: once the newer has left, its superseded marker lapses with it.
    older = started_reading(start_trainer, "same", master=proc.address, log=log, delay="0.05")
    newer = start_trainer("same", master=proc.address, log=log, args=("--delay", "0.02"))
    assert older.wait() == 4, older.output_text() + "\n--- newer:\n" + newer.output_text()
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
    write_records(tmp_path / "data", files=1, records_per_file=1)
    proc = serving(start_master("--input", str(tmp_path / "data")))
    connection = MasterConnection(MasterLocator(master_endpoint=proc.address), deadline=5)
    try:
        in_use, _ = connection._connect(proc.address)
        connection._connect(f"127.0.0.1:{free_port()}")  # another thread moves on
        async def status_on_the_old_channel():
            return await in_use.GetStatus(pb.GetStatusRequest(), timeout=5)
        assert connection.wait(status_on_the_old_channel()).phase == "Running"
    finally:
        connection.close()


# ---- errors are told by their ErrorInfo, never by their text ------------------------------

WITHHELD = "(message withheld by the test)"


class _Withheld(grpc.RpcError, grpc.Call):
    """A failed call as the client sees it when a master words its messages differently:
    same code and ErrorInfo, no human text to go by."""

    def __init__(self, error: grpc.RpcError) -> None:
        self._code = error.code()
        self._metadata = []
        for key, value in error.trailing_metadata() or ():
            if key == "grpc-status-details-bin":
                rich = status_pb2.Status.FromString(value)
                rich.message = WITHHELD
                value = rich.SerializeToString()
            self._metadata.append((key, value))

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return WITHHELD

    def trailing_metadata(self):
        return tuple(self._metadata)

    def initial_metadata(self):
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self):
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback) -> bool:
        return False


class _Withholding:
    """A call's future whose failure comes without its message (`_Withheld`)."""

    def __init__(self, outcome) -> None:
        self._outcome = outcome

    def add_done_callback(self, callback) -> None:
        self._outcome.add_done_callback(lambda _: callback(self))

    def cancel(self) -> bool:
        return self._outcome.cancel()

    def result(self, timeout=None):
        try:
            return self._outcome.result(timeout)
        except grpc.RpcError as error:
            raise _Withheld(error) from None


class WithholdMessages(grpc.UnaryUnaryClientInterceptor):
    def intercept_unary_unary(self, continuation, client_call_details, request):
        return _Withholding(continuation(client_call_details, request))


def without_messages(address: str) -> grpc.Channel:
    return grpc.intercept_channel(grpc.insecure_channel(address), WithholdMessages())


@dataclass(frozen=True)
class StaleLocator(MasterLocator):
    """Resolves to one address, as an etcd read from before a failover would."""

    stale: str = ""

    def resolve(self, *, timeout: float = 5.0, avoid: str | None = None) -> str:
        return self.stale


def test_a_standby_s_leader_hint_is_followed_from_its_error_info(tmp_path, start_master,
                                                                etcd_endpoint, job_name):
    write_records(tmp_path / "data", files=1, records_per_file=1)
    masters = [start_master("--input", str(tmp_path / "data"), name=f"m{i}") for i in range(2)]
    leader_address = []

    def leader_published() -> bool:
        try:
            leader_address[:] = [MasterLocator(etcd_endpoints=etcd_endpoint, job=job_name).resolve()]
        except DiscoveryError:
            return False
        return True
    wait_until(leader_published, message="no leader published")
    serving(next(m for m in masters if m.address == leader_address[0]))
    standby = next(m for m in masters if m.address != leader_address[0])

    def standby_names_the_leader() -> bool:
        with grpc.insecure_channel(standby.address) as channel:
            try:
                stub(channel).GetStatus(pb.GetStatusRequest(), timeout=5)
            except grpc.RpcError as error:
                return error_info(error) == (Reason.NOT_LEADER, {"leader": leader_address[0]})
        return False
    wait_until(standby_names_the_leader, message="the standby does not name the leader")

    # The locator keeps answering the standby: only the hint in the ErrorInfo leads on.
    locator = StaleLocator(etcd_endpoints=etcd_endpoint, job=job_name, stale=standby.address)
    connection = MasterConnection(locator, deadline=20, open_channel=without_messages)
    try:
        assert connection.get_status().phase == "Running"
        assert connection.address == leader_address[0]
    finally:
        connection.close()


def test_the_locator_avoids_a_silent_leader_while_etcd_still_names_it(tmp_path, start_master,
                                                                      etcd_endpoint, job_name):
    """A master that did not answer is avoided while the leader key names it: another master
    present in etcd (a standby) is given instead, if there is one."""
    write_records(tmp_path / "data", files=1, records_per_file=1)
    locator = MasterLocator(etcd_endpoints=etcd_endpoint, job=job_name)
    first = serving(start_master("--input", str(tmp_path / "data"), name="first"))
    assert locator.resolve() == first.address
    assert locator.resolve(avoid=first.address) == first.address  # no other master: the leader
    second = start_master("--input", str(tmp_path / "data"), name="second")
    wait_until(lambda: locator.resolve(avoid=first.address) == second.address,
               message="the standby was never given in the silent leader's place")
    assert locator.resolve() == first.address
    assert locator.resolve(avoid=second.address) == first.address  # not the leader: no matter


def test_through_a_failover_a_trainer_waits_at_the_standby_not_at_the_dead_leader(
        tmp_path, start_master, etcd_endpoint, job_name):
    """The leader SIGKILLed: a trainer that finds masters through etcd goes to the standby
    while the dead leader's key lapses (a short hold: it is held there again and again, and
    told about the dead leader each time), and is served by it once it leads."""
    write_records(tmp_path / "data", files=1, records_per_file=1)
    args = ("--input", str(tmp_path / "data"), "--election-ttl", "5s", "--session-ttl", "30s",
            "--failover-hold", "0.5s")
    masters = [start_master(*args, name=name, metrics=True) for name in ("first", "second")]
    locator = MasterLocator(etcd_endpoints=etcd_endpoint, job=job_name)

    def both_present() -> bool:  # a leader published, and each master given in the other's place
        try:
            return len({locator.resolve(avoid=m.address) for m in masters}) == 2
        except DiscoveryError:
            return False
    wait_until(both_present, message="the two masters were never both present")
    leader = next(m for m in masters if m.address == locator.resolve())
    standby = next(m for m in masters if m is not leader)
    serving(leader)
    connection = MasterConnection(locator, deadline=60, open_channel=without_messages)
    try:
        session = connection.register_trainer("t").session_id
        leader.kill()
        connection.keep_alive(session)  # served by the standby once it leads
        assert connection.address == standby.address
    finally:
        connection.close()
    held = 'paddlecloud_master_held_calls_total{outcome="not_leader"}'
    assert metric(standby.metrics_port, held) >= 1  # the trainer was there before the election


def test_a_superseded_session_is_told_by_its_error_info(tmp_path, start_master):
    write_records(tmp_path / "data", files=1, records_per_file=1)
    proc = serving(start_master("--input", str(tmp_path / "data")))
    connection = MasterConnection(MasterLocator(master_endpoint=proc.address), deadline=20,
                                  open_channel=without_messages)
    older, newer = (Session(connection, trainer_id="same") for _ in range(2))
    try:
        older.register()
        newer.register()
        keep_alive = connection.keep_alive
        with pytest.raises(TrainerSuperseded, match=f"session {older.id} superseded by a newer session "
                                                    "of trainer same; another process uses this trainer id"):
            older.run(keep_alive)
        with pytest.raises(TrainerSuperseded):  # for good: it never registers again
            older.run(keep_alive)
        assert not older.active and newer.active
        newer.run(keep_alive)
    finally:
        for session in (older, newer):
            session.close()
        connection.close()


def test_an_expired_session_registers_again_told_by_its_error_info(tmp_path, start_master):
    write_records(tmp_path / "data", files=1, records_per_file=1)
    proc = serving(start_master("--input", str(tmp_path / "data"), "--session-ttl", "2s"))
    connection = MasterConnection(MasterLocator(master_endpoint=proc.address), deadline=20,
                                  open_channel=without_messages)
    session = Session(connection, trainer_id="sleeper")
    try:
        session.register()
        first = session.id
        session.close()  # no more keep-alives: the master lets the session expire

        def expired() -> bool:
            with grpc.insecure_channel(proc.address) as channel:
                reply = stub(channel).ListTrainers(pb.ListTrainersRequest(page_size=10))
            return not reply.trainers
        wait_until(expired, message="the session never expired")
        session.run(connection.keep_alive)
        assert session.id not in (0, first) and session.reregistrations == 1
    finally:
        connection.close()


def test_a_session_that_expires_again_before_the_retry_lands_is_registered_again(tmp_path, start_master):
    """The session ends between the re-registration and the retried call (a pause, a failover):
    the call is not lost to one more expiry; the retries are bounded (EXPIRED_RETRIES)."""
    from trainer_agent.client import EXPIRED_RETRIES

    write_records(tmp_path / "data", files=1, records_per_file=1)
    proc = serving(start_master("--input", str(tmp_path / "data")))
    connection = MasterConnection(MasterLocator(master_endpoint=proc.address), deadline=20,
                                  open_channel=without_messages)
    session = Session(connection, trainer_id="unlucky")
    ended: list[int] = []

    def ending_first(times: int):
        def call(s: int) -> None:
            if len(ended) < times:  # the session ends just before the call lands
                connection.leave_trainer(s, timeout=10)
                ended.append(s)
            connection.keep_alive(s)
        return call

    try:
        session.register()
        session.run(ending_first(2))
        assert session.reregistrations == 2 and session.id not in ended and len(set(ended)) == 2
        ended.clear()
        with pytest.raises(grpc.RpcError) as refused:
            session.run(ending_first(EXPIRED_RETRIES + 1))
        assert refused.value.code() is grpc.StatusCode.NOT_FOUND
        assert len(ended) == EXPIRED_RETRIES + 1
    finally:
        session.close()
        connection.close()


# ---- the package ------------------------------------------------------------------------


@pytest.mark.unit
def test_locator_from_the_environment():
    assert MasterLocator.from_env({"PADDLE_MASTER_ENDPOINT": "10.0.0.1:8080"}) == MasterLocator(
        master_endpoint="10.0.0.1:8080")
    assert MasterLocator.from_env({"PADDLE_ETCD_ENDPOINTS": "http://e:2379", "PADDLE_JOB_NAME": "j",
                                   "PADDLE_NAMESPACE": "ml"}) == MasterLocator(
        etcd_endpoints="http://e:2379", job="j", namespace="ml")
    with pytest.raises(DiscoveryError, match="PADDLE_MASTER_ENDPOINT"):
        MasterLocator.from_env({"PADDLE_JOB_NAME": "j"})


def test_the_package_exports_its_api_without_importing_paddle():
    script = ("import sys\n"
              "from trainer_agent import TaskClient, save_checkpoint, load_checkpoint, TrainStatus\n"
              "import trainer_agent\n"
              "assert 'MasterDataset' in trainer_agent.__all__ and 'MasterDataset' in dir(trainer_agent)\n"
              "print(sorted(m for m in sys.modules if m == 'paddle' or m.startswith('paddle.')))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    with pytest.raises(AttributeError, match="no attribute 'MasterDatset'"):
        import trainer_agent
        trainer_agent.MasterDatset  # noqa: B018


# ---- a trainer stopped with SIGTERM leaves first (trainer_agent.termination) --------------

STOPPED_TRAINER = """
import ctypes, os, signal, sys, time
from trainer_agent.client import TaskClient

trainer_id, how = sys.argv[1], sys.argv[2]
if how == "own-handler-first":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
client = TaskClient.from_env(trainer_id=trainer_id)
if how.startswith("drain"):  # a program that drains to a checkpoint on SIGTERM
    from trainer_agent import termination
    termination.drain_on_stop()
if how == "registered-by-a-thread":  # as a Paddle DataLoader reads its dataset
    import threading
    replies = []
    reader = threading.Thread(target=lambda: (client.register(), replies.append(client.fetch(0).result())))
    reader.start()
    reader.join()
    reply = replies[0]
else:
    client.register()
    reply = client.fetch(0).result()
assert reply.task.chunks  # holds a task now
if how == "own-handler-after":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
if how == "after-a-forked-child":  # a DataLoader worker's way: SIGTERM kills it, nothing more
    child = os.fork()
    if child == 0:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        os._exit(0)
    print("child", os.waitpid(child, 0)[1], flush=True)
print("holding", flush=True)
if how == "drain-and-exit":  # the program sees the stop, saves (here: nothing) and exits as stopped
    while not termination.stop_requested():
        time.sleep(0.05)
    client.close()
    sys.exit(termination.STOPPED_EXIT)
if how in ("in-c", "drain-stuck"):
    # a zeroed pthread_mutex_t is an unlocked default mutex: the second lock blocks in C
    # forever, signals or not, as a collective call waiting for a dead peer does
    mutex = ctypes.create_string_buffer(64)
    libc = ctypes.CDLL(None)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)
while True:
    time.sleep(1)
"""


@pytest.mark.parametrize("how, code", [("in-c", 143), ("in-python", 143), ("after-a-forked-child", 143),
                                       ("registered-by-a-thread", 143),
                                       ("own-handler-first", 7), ("own-handler-after", 7),
                                       ("drain-and-exit", 143), ("drain-stuck", 143)])
def test_a_trainer_stopped_with_sigterm_leaves_and_its_task_returns_at_once(tmp_path, start_master,
                                                                           how, code):
    write_records(tmp_path / "data", files=2, records_per_file=5)
    proc = serving(start_master("--input", str(tmp_path / "data"), "--session-ttl", "120s"))
    program = tmp_path / "stopped_trainer.py"
    program.write_text(STOPPED_TRAINER)
    # a drain stuck in C (a collective waiting for a dead peer) ends at the grace: the watchdog
    trainer = subprocess.Popen([sys.executable, str(program), "t", how], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, PADDLE_MASTER_ENDPOINT=proc.address,
                                        PADDLECLOUD_STOP_GRACE="1"))
    try:
        if how == "after-a-forked-child":  # killed by SIGTERM, the child left nothing of the parent's
            assert trainer.stdout.readline().split() == ["child", str(signal.SIGTERM.value)]
            assert status(proc).trainers_alive == 1
        assert trainer.stdout.readline().strip() == "holding"
        assert len(tasks(proc, pb.PENDING)) == 1
        trainer.send_signal(signal.SIGTERM)
        assert trainer.wait(timeout=60) == code
        errors = trainer.stderr.read()
        assert ("draining to a checkpoint" in errors) == how.startswith("drain"), errors
        assert ("the last checkpoint stands" in errors) == (how == "drain-stuck"), errors
    finally:
        trainer.kill()
        trainer.wait()
    if code == 143:  # left: far sooner than the session's 120 s TTL would have ended it
        assert status(proc).trainers_alive == 0
        assert tasks(proc, pb.PENDING) == []
        assert all(t.failures == 0 for t in tasks(proc, pb.TODO))
    else:  # the program's own handler ran instead, and nothing of ours
        assert status(proc).trainers_alive == 1


STALLED = """
import sys, time
from trainer_agent import termination
termination.drain_on_stop()
print("ready", flush=True)
if sys.argv[1] == "stepping":   # a loop that keeps stepping: only the grace ends the drain
    while True:
        termination.note_progress()
        time.sleep(0.05)
while True:                      # stuck in a collective with a peer gone: no step at all
    time.sleep(1)
"""


@pytest.mark.parametrize("how", ["stalled", "stepping"])
def test_a_drain_that_stopped_stepping_is_given_up_at_the_stall_not_the_grace(tmp_path, how):
    program = tmp_path / "stalled.py"
    program.write_text(STALLED)
    trainer = subprocess.Popen([sys.executable, str(program), how], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, PADDLECLOUD_STOP_GRACE="5",
                                        PADDLECLOUD_STOP_STALL="1"))
    try:
        assert trainer.stdout.readline().strip() == "ready"
        trainer.send_signal(signal.SIGTERM)
        assert trainer.wait(timeout=60) == 143
    finally:
        trainer.kill()
        trainer.wait()
    errors = trainer.stderr.read()
    # which rule ended it: the stall (a group that stopped stepping), or the grace
    assert ("no training step for 1s" in errors) == (how == "stalled"), errors
    assert ("did not end within 5s" in errors) == (how == "stepping"), errors
