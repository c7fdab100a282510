"""Elastic local jobs: a trainer range, `paddlecloud job scale` while the job runs (PS mode)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import grpc
import pytest
from datasets import write_records
from etcd_history import check_job_exactly_once, mark_history
from local_runs import leader_of
from processes import find
from trainers import read_log
from waiting import wait_until

from paddlecloud.api import pb, pb_grpc
from paddlecloud.auth import master_credentials
from paddlecloud.keys import JobKeys

STUB = "trainer_agent.stub"


def _status(address: str) -> pb.GetStatusResponse:
    """As the operator of the run (PADDLE_JOB_TOKEN_FILE names its token: see `_as_operator`)."""
    credentials = master_credentials()
    with credentials.channel(address) as channel:
        return pb_grpc.MasterStub(channel).GetStatus(pb.GetStatusRequest(), timeout=5,
                                                     metadata=credentials.metadata())


def _as_operator(monkeypatch, run) -> None:
    """This test's calls (and the `job scale` it runs) carry the local run's operator token."""
    monkeypatch.setenv("PADDLE_JOB_TOKEN_FILE", str(run.operator_token))


def _alive(address: str) -> int:
    """Trainers alive, -1 while the master does not serve yet (elected, still loading)."""
    try:
        return _status(address).trainers_alive
    except grpc.RpcError:
        return -1


def test_ps_job_scaled_2_4_1_3_counts_every_task_once_and_no_failure(tmp_path, local_run, job_name,
                                                                      etcd_endpoint, monkeypatch):
    keys = JobKeys("local", job_name)
    write_records(tmp_path / "data", files=6, records_per_file=100)
    run = local_run("--module", STUB, "--input", str(tmp_path / "data"), "--trainers", "2",
                    "--min-trainers", "1", "--max-trainers", "4", "--pservers", "1",
                    "--pserver-module", "pserver_agent.stub", "--epochs", "3", "--chunk-bytes", "300",
                    "--etcd-endpoints", etcd_endpoint, "--", "--delay", "0.03")
    _as_operator(monkeypatch, run)
    wait_until(lambda: asyncio.run(leader_of(etcd_endpoint, job_name)), timeout=60, message="no leader")
    address = asyncio.run(leader_of(etcd_endpoint, job_name))
    wait_until(lambda: _alive(address) == 2, timeout=90, message="2 trainers never alive")
    status = _status(address)
    assert (status.min_trainers, status.max_trainers, status.desired_trainers) == (1, 4, 2)

    refused = run.scale(address, 5)
    assert refused.returncode != 0 and "5 trainers is outside the job's range 1..4" in refused.stderr

    for size in (4, 1, 3):
        read_before = len(read_log(run.records))
        done = run.scale(address, size)
        assert done.returncode == 0, done.stderr
        assert f"desired trainers {size} (range 1..4)" in done.stdout
        wait_until(lambda size=size: _alive(address) == size, timeout=90,
                   message=f"the job never ran {size} trainers")
        assert _status(address).desired_trainers == size
        # the new size trains: records keep coming, from the new trainers too (the job goes on)
        joined = {str(i) for i in range(size)} if size == 4 else set()

        def trained(n=read_before, joined=joined) -> bool:
            rows = read_log(run.records)
            return (len(rows) >= n + 20 and joined <= {t for _, t, _, _ in rows[n:]}
                    or run.process.poll() is not None)
        wait_until(trained, timeout=90, message=f"no progress at {size} trainers")
        assert run.process.poll() is None, "the job ended before the resize sequence was through"

    assert run.wait() == 0, run.text()
    text = run.text()
    assert "scaling the trainers 2 -> 4" in text and "scaling the trainers 4 -> 1" in text
    assert "scaling the trainers 1 -> 3" in text and "restarting it" not in text
    # trainers 2 and 3 joined and read records; every task counted once per epoch
    assert {"0", "1", "2", "3"} <= {t for _, t, _, _ in read_log(run.records)}
    check_job_exactly_once(etcd_endpoint, keys, num_epochs=3)
    # the trainers that left gave their tasks back: no failure was ever counted
    assert asyncio.run(mark_history(etcd_endpoint, keys, "failures")) == []


def test_collective_resize_schedule_restarts_the_group_at_each_size(tmp_path, local_run, job_name,
                                                                    etcd_endpoint):
    keys = JobKeys("local", job_name)
    write_records(tmp_path / "data", files=4, records_per_file=60)
    run = local_run("--module", STUB, "--input", str(tmp_path / "data"), "--resize-schedule",
                    "2@0s,1@6s,3@12s", "--epochs", "2", "--chunk-bytes", "300",
                    "--etcd-endpoints", etcd_endpoint, "--", "--delay", "0.05")
    assert run.wait() == 0, run.text()
    text = run.text()
    assert "scaling the trainers 2 -> 1" in text and "scaling the trainers 1 -> 3" in text
    assert text.count("the master restarted epoch") == 2  # one group restart per resize
    assert "restarting the trainer group" not in text     # nobody died
    # the group of 3 ran with ids 0..2 and PADDLE_TRAINERS_NUM=3
    assert "resize schedule: 3 trainers at 12s" in text
    assert "trainer 2 registered: session" in (run.output / "logs" / "master-0.log").read_text()
    check_job_exactly_once(etcd_endpoint, keys, num_epochs=2)


@pytest.mark.parametrize("schedule, fragment", [
    ("2@5s,3@1s", "resize step '3@1s' comes before"),
    ("2@0s,4", "resize step '4': write SIZE@TIME"),
    ("2@0s,5@1s --max-trainers 4", "5 trainers is outside the job's range 2..4"),
])
def test_a_bad_resize_schedule_is_a_usage_error_naming_it(tmp_path, job_name, schedule, fragment):
    write_records(tmp_path / "data", files=1, records_per_file=5)
    value, *more = schedule.split()
    result = subprocess.run([sys.executable, "-m", "paddlecloud", "local", "train", "--job", job_name,
                             "--module", STUB, "--input", str(tmp_path / "data"), "--output",
                             str(tmp_path / "out"), "--resize-schedule", value, *more],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and fragment in result.stderr, result.stderr


def test_the_progress_view_shows_the_trainer_range_once_the_master_told_it():
    from paddlecloud.backends.local.job import Progress
    from paddlecloud.backends.local.view import ConsoleView

    p = Progress(phase="Running", num_epochs=2, trainers_alive=3)
    assert "range" not in ConsoleView.plain(p)
    p.min_trainers, p.max_trainers, p.desired_trainers = 1, 4, 3
    assert "trainers alive 3 (desired 3, range 1..4)" in ConsoleView.plain(p)


def _done_tasks(address: str, epoch: int) -> list[int]:
    credentials = master_credentials()
    with credentials.channel(address) as channel:
        reply = pb_grpc.MasterStub(channel).ListTasks(
            pb.ListTasksRequest(state=pb.DONE, epoch=epoch, page_size=1000), timeout=5,
            metadata=credentials.metadata())
    return [t.id for t in reply.tasks]


def test_a_group_restart_resumes_the_epoch_with_the_checkpoints_tasks_done(tmp_path, local_run, job_name,
                                                                           etcd_endpoint, monkeypatch):
    """The granted trainer's checkpoint inside epoch 0 names the tasks the model consumed (here
    written by the test, as the trainer would): after a trainer dies, the group restarts epoch
    0 with exactly those done, so their records are not read again in that epoch."""
    from trainer_agent.checkpoint import TrainStatus, save_checkpoint

    keys = JobKeys("local", job_name)
    write_records(tmp_path / "data", files=4, records_per_file=60)
    run = local_run("--module", STUB, "--input", str(tmp_path / "data"), "--trainers", "2",
                    "--epochs", "2", "--chunk-bytes", "300", "--etcd-endpoints", etcd_endpoint,
                    "--", "--delay", "0.03")
    _as_operator(monkeypatch, run)
    wait_until(lambda: asyncio.run(leader_of(etcd_endpoint, job_name)), timeout=60, message="no leader")
    address = asyncio.run(leader_of(etcd_endpoint, job_name))
    wait_until(lambda: _alive(address) >= 0 and len(_done_tasks(address, 0)) >= 3, timeout=90,
               message="no task done")
    consumed = tuple(_done_tasks(address, 0))
    save_checkpoint(str(run.output / "checkpoints"), {}, TrainStatus(0, tasks_done=consumed))
    os.kill(find(job_name, module=STUB, PADDLE_TRAINER_ID="0")[0], signal.SIGKILL)
    assert run.wait() == 0, run.text()
    assert f"the master restarted epoch 0 with the checkpoint's {len(consumed)} tasks done" in run.text()
    rows = read_log(run.records)
    for task in consumed:  # read once in epoch 0: before the checkpoint, never after the restart
        records = [r for e, _, t, r in rows if e == 0 and t == task]
        assert records and len(records) == len(set(records)), (task, records)
    check_job_exactly_once(etcd_endpoint, keys, num_epochs=2)


# A trainer that crashes once, after the job's data is done: the stub reads to the end,
# then trainer 1 exits 1 the first time (the marker file says it did), having saved a
# checkpoint of the whole job first when a checkpoint directory is given.
CRASHING_AT_THE_END = '''
import os, sys
from pathlib import Path
from trainer_agent import stub
from trainer_agent.checkpoint import TrainStatus, save_checkpoint

code = stub.main([])
marker = Path(sys.argv[1])
if code == 0 and os.environ["PADDLE_TRAINER_ID"] == "1" and not marker.exists():
    if len(sys.argv) > 2:
        save_checkpoint(sys.argv[2], {}, TrainStatus(int(sys.argv[3])))
    marker.write_text("crashed once, after the data was done\\n")
    sys.exit(1)
sys.exit(code)
'''


@pytest.mark.parametrize("final_checkpoint", [False, True])
def test_a_group_that_loses_a_member_after_the_data_s_end_is_restarted_from_its_checkpoint(
        tmp_path, local_run, job_name, etcd_endpoint, final_checkpoint):
    """The group's work since its checkpoint is in no saved model once a member died before the
    end: the group restarts, and the master reopens the job there (no checkpoint: from epoch 0)
    instead of the job failing. A checkpoint saved at the last epoch's end holds the whole
    job: the group restarts and nothing is read again."""
    keys = JobKeys("local", job_name)
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "crashing_trainer.py").write_text(CRASHING_AT_THE_END)
    marker = tmp_path / "crashed"
    write_records(tmp_path / "data", files=4, records_per_file=20)
    checkpoint = [str(tmp_path / "out" / "checkpoints"), "1"] if final_checkpoint else []
    run = local_run("--module", "crashing_trainer", "--package-path", str(package),
                    "--input", str(tmp_path / "data"), "--trainers", "2", "--epochs", "2",
                    "--chunk-bytes", "300", "--etcd-endpoints", etcd_endpoint, "--", str(marker),
                    *checkpoint)
    assert run.wait() == 0, run.text()
    text = run.text()
    assert marker.exists()
    assert "trainer 1 died: restarting the trainer group" in text
    rows = read_log(run.records)
    reads = [sum(1 for e, _, _, _ in rows if e == epoch) for epoch in (0, 1)]
    records = len({r for _, _, _, r in rows})
    if final_checkpoint:
        assert "the checkpoint holds the whole job: no epoch to restart" in text
        assert "the master restarted epoch" not in text
        assert reads == [records, records]  # each record once per epoch: nothing read again
    else:
        assert "the master restarted epoch 0" in text
        assert reads == [2 * records, 2 * records]  # the whole job read again, once more
    check_job_exactly_once(etcd_endpoint, keys, num_epochs=2)
