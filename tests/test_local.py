"""`paddlecloud local train` end to end with stub trainers: the real CLI, real children."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import write_records
from local_runs import LocalRun
from masters import wait_until
from processes import find, job_processes
from trainers import read_log, reads_per_epoch

from paddlecloud.etcd_server import free_port

STUB = "trainer_agent.stub"




def all_records(files: int, per_file: int) -> set[str]:
    return {f"{f}-{i},{(f * 31 + i) % 97}" for f in range(files) for i in range(per_file)}


def test_stub_job_succeeds_reads_everything_and_leaves_no_process(tmp_path, local_run, job_name):
    write_records(tmp_path / "data", files=5, records_per_file=20)
    run = local_run("--module", STUB, "--input", str(tmp_path / "data" / "*.csv"), "--trainers", "2",
                    "--epochs", "2", "--chunk-bytes", "100")
    assert run.wait() == 0, run.text()
    reads = reads_per_epoch(read_log(run.records))
    assert sorted(reads) == [0, 1] and all(set(c) == all_records(5, 20) for c in reads.values())
    text = run.text()
    # the stub trainers print nothing of their own: the master tells each registration
    assert "[master 0]" in text and "trainer 1 registered: session" in text and f"job {job_name} succeeded" in text
    logs = {p.name for p in (run.output / "logs").iterdir()}
    assert {"master-0.log", "trainer-0.log", "trainer-1.log", "etcd.log"} <= logs
    # each registration logged once, by the master, with a short session id (the trainer's own
    # line is debug: the console showed every registration twice, with 19-digit ids)
    master_log = (run.output / "logs" / "master-0.log").read_text()
    assert re.search(r"trainer 0 registered: session [0-9a-f]{1,6}$", master_log, re.M), master_log[-2000:]
    assert "trainer 0 registered" not in (run.output / "logs" / "trainer-0.log").read_text()
    assert job_processes(job_name) == []


def test_ctrl_c_stops_every_child_and_removes_the_private_etcd(tmp_path, local_run, job_name):
    write_records(tmp_path / "data", files=3, records_per_file=200)
    run = local_run("--module", STUB, "--input", str(tmp_path / "data"), "--trainers", "2",
                    "--chunk-bytes", "500", "--", "--delay", "0.05")
    wait_until(lambda: len(read_log(run.records)) >= 5, timeout=90, message="no record read")
    etcd_dir = next(line.split("data in ")[1].rstrip(")") for line in run.text().splitlines()
                    if line.startswith("[local] etcd ") and " started at " in line)
    assert Path(etcd_dir).is_dir()
    run.process.send_signal(signal.SIGINT)
    assert run.wait(timeout=60) == 128 + signal.SIGINT
    wait_until(lambda: job_processes(job_name) == [], timeout=10, message="children outlived the CLI")
    assert not Path(etcd_dir).exists()
    assert "interrupted" in run.text()


def test_ps_job_restarts_only_the_killed_trainer(tmp_path, local_run, job_name, etcd_endpoint):
    write_records(tmp_path / "data", files=4, records_per_file=60)
    run = local_run("--module", STUB, "--input", str(tmp_path / "data"), "--trainers", "3",
                    "--pservers", "2", "--pserver-module", "pserver_agent.stub",
                    "--epochs", "2", "--chunk-bytes", "300",
                    "--etcd-endpoints", etcd_endpoint, "--session-ttl", "3s", "--", "--delay", "0.01")
    wait_until(lambda: len(read_log(run.records)) >= 30, timeout=90, message="no progress")
    victims = find(job_name, module=STUB, PADDLE_TRAINER_ID="1")
    others = {pid for i in ("0", "2") for pid in find(job_name, module=STUB, PADDLE_TRAINER_ID=i)}
    assert len(victims) == 1 and len(others) == 2
    os.kill(victims[0], signal.SIGKILL)
    assert run.wait() == 0, run.text()
    assert "trainer 1 exited with" in run.text() and "restarting it" in run.text()
    assert "[pserver 0]" in run.text() and "[pserver 1]" in run.text()
    assert "restarting the trainer group" not in run.text()
    reads = reads_per_epoch(read_log(run.records))
    assert sorted(reads) == [0, 1] and all(set(c) == all_records(4, 60) for c in reads.values())
    trainers = {t for _, t, _, _ in read_log(run.records)}
    assert trainers == {"0", "1", "2"}
    # Only trainer 1 was restarted; and the master counted every task once per epoch.
    assert "trainer 0 exited" not in run.text() and "trainer 2 exited" not in run.text()

    from etcd_history import check_job_exactly_once

    from paddlecloud.keys import JobKeys
    check_job_exactly_once(etcd_endpoint, JobKeys("local", job_name), num_epochs=2)


@pytest.mark.parametrize("args, fragment", [
    ((), "Missing option '--module'"),
    (("--module", "no.such.module", "--input", "{data}"), "module 'no.such.module' not found"),
    (("--module", STUB, "--input", "{tmp}/missing-*.csv"), "missing-*.csv' matches no file"),
    (("--module", STUB, "--input", "{data}", "--trainers", "0"), "--trainers"),
    (("--module", STUB, "--input", "{data}", "-e", "NOEQUALS"), "'NOEQUALS' is not KEY=VALUE"),
    (("--module", STUB, "--input", "{data}", "--etcd-endpoints", "http://127.0.0.1:{port}"),
     "etcd unreachable at http://127.0.0.1:{port}"),
])
def test_bad_input_is_one_error_naming_the_value_and_starts_nothing(tmp_path, job_name, args, fragment):
    write_records(tmp_path / "data", files=1, records_per_file=1)
    port = str(free_port())
    subst = {"data": str(tmp_path / "data"), "tmp": str(tmp_path), "port": port}
    args = tuple(a.format(**subst) for a in args)
    result = subprocess.run([sys.executable, "-m", "paddlecloud", "local", "train", "--job", job_name,
                             "--output", str(tmp_path / "out"), *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert fragment.format(**subst) in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "logs").exists()
    assert job_processes(job_name) == []


def leader_pid(job: str, etcd_endpoint: str) -> int:
    import asyncio

    from paddlecloud import etcd
    from paddlecloud.keys import JobKeys

    async def leader() -> str | None:
        client = await etcd.connect(etcd_endpoint)
        try:
            value = await client.get(JobKeys("local", job).leader)
            return value.value.decode() if value else None
        finally:
            await client.close()

    wait_until(lambda: asyncio.run(leader()) is not None, message="no leader")
    address = asyncio.run(leader())
    pids = [pid for pid, argv, _ in job_processes(job) if "--advertise" in argv and address in argv]
    assert len(pids) == 1, pids
    return pids[0]


def test_two_masters_survive_the_leader_sigkill(tmp_path, local_run, job_name, etcd_endpoint):

    from etcd_history import check_job_exactly_once

    from paddlecloud.keys import JobKeys

    write_records(tmp_path / "data", files=4, records_per_file=60)
    run = local_run("--module", STUB, "--input", str(tmp_path / "data"), "--trainers", "2", "--masters", "2",
                    "--epochs", "2", "--chunk-bytes", "300", "--etcd-endpoints", etcd_endpoint,
                    "--", "--delay", "0.01")
    wait_until(lambda: len(read_log(run.records)) >= 30, timeout=90, message="no progress")
    os.kill(leader_pid(job_name, etcd_endpoint), signal.SIGKILL)
    assert run.wait() == 0, run.text()
    check_job_exactly_once(etcd_endpoint, JobKeys("local", job_name), num_epochs=2)
    reads = reads_per_epoch(read_log(run.records))
    assert all(set(c) == all_records(4, 60) for c in reads.values())


def test_group_mode_restarts_every_trainer_and_the_epoch(tmp_path, local_run, job_name, etcd_endpoint):

    from etcd_history import check_job_exactly_once

    from paddlecloud.keys import JobKeys

    write_records(tmp_path / "data", files=4, records_per_file=60)
    run = local_run("--module", STUB, "--input", str(tmp_path / "data"), "--trainers", "2",
                    "--epochs", "2", "--chunk-bytes", "300", "--etcd-endpoints", etcd_endpoint,
                    "--", "--delay", "0.05")  # ~12 s of reading: trainer 0 is still at it when killed
    registered = "INFO master.trainers: trainer 1 registered: session "  # the master says it, once
    wait_until(lambda: registered in run.text() and len(read_log(run.records)) >= 30, timeout=90,
               message="no progress")
    victim = wait_until(lambda: find(job_name, module=STUB, PADDLE_TRAINER_ID="0"), timeout=30,
                        message="trainer 0 not running")[0]
    os.kill(victim, signal.SIGKILL)
    assert run.wait() == 0, run.text()
    text = run.text()
    assert "restarting the trainer group" in text and "the master restarted epoch 0" in text
    check_job_exactly_once(etcd_endpoint, JobKeys("local", job_name), num_epochs=2)
    # The survivor was restarted with the group, not left running: it registered twice.
    assert text.count(registered) == 2


@pytest.mark.timeout(300)  # three local runs in a row
def test_a_changed_dataset_needs_fresh_and_the_master_error_is_shown(tmp_path, job_name, etcd_endpoint):
    write_records(tmp_path / "a", files=2, records_per_file=3)
    write_records(tmp_path / "b", files=3, records_per_file=3)

    def run(data: str, *extra: str) -> LocalRun:
        local = LocalRun(tmp_path, job_name, "--module", STUB, "--input", str(tmp_path / data),
                         "--etcd-endpoints", etcd_endpoint, *extra)
        local.wait()
        return local

    assert run("a").process.returncode == 0
    changed = run("b")
    assert changed.process.returncode == 1
    assert "already has a different dataset in etcd" in changed.text()
    assert "master 0 exited with 2" in changed.text()
    assert run("b", "--fresh").process.returncode == 0
    assert job_processes(job_name) == []


# A trainer that takes a task from the master, reads one record of it and quits with 0.
QUITS = """
from trainer_agent import TaskClient

with TaskClient.from_env() as client:
    for epoch in client.epochs():
        next(iter(epoch.records()), None)
        break
print('leaving after one record')
"""


def _package_with_a_master_py(tmp_path: Path) -> Path:
    """A user's package whose `master.py` breaks whoever imports it, beside a trainer that quits."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "master.py").write_text("raise SystemExit('the user master.py was imported')\n")
    (package / "quits.py").write_text(QUITS)
    return package


def test_a_master_py_in_the_package_path_does_not_shadow_the_service(tmp_path, local_run, job_name):
    write_records(tmp_path / "data", files=2, records_per_file=10)
    package = _package_with_a_master_py(tmp_path)
    run = local_run("--module", STUB, "--package-path", str(package), "--input",
                    str(tmp_path / "data"), "--trainers", "2", "--chunk-bytes", "100")
    assert run.wait() == 0, run.text()
    assert "the user master.py was imported" not in run.text()
    reads = reads_per_epoch(read_log(run.records))
    assert sorted(reads) == [0] and set(reads[0]) == all_records(2, 10)


def test_trainers_that_took_tasks_and_exit_0_without_the_data_done_fail_the_job(
        tmp_path, local_run, job_name):
    """The "data is not done" rule holds for trainers that used the master (a job that brings
    its own data, whose trainers never took a task, ends by their exits: test_local_own_data)."""
    write_records(tmp_path / "data", files=2, records_per_file=10)
    package = _package_with_a_master_py(tmp_path)
    run = local_run("--module", "quits", "--package-path", str(package), "--input",
                    str(tmp_path / "data"), "--trainers", "2")
    assert run.wait() == 1, run.text()
    text = run.text()
    assert "leaving after one record" in text  # the package path reached the user's code
    assert "every trainer exited 0 but the data is not done" in text
    assert f"job {job_name} failed" in text
    assert job_processes(job_name) == []
