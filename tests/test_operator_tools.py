"""What an operator sees: grpcurl through reflection, health, Prometheus metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
from datasets import write_records
from masters import pb, stub, wait_for, wait_serving

from paddlecloud.etcd_server import free_port

GRPCURL = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")


def grpcurl(address: str, *args: str, data: str | None = None) -> str:
    """Runs the real grpcurl binary: `grpcurl -plaintext [-d DATA] ADDRESS ARGS...`."""
    flags = ["-d", data] if data is not None else []
    result = subprocess.run([GRPCURL, "-plaintext", "-emit-defaults", *flags, address, *args],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
async def busy_master(tmp_path, start_master):
    write_records(tmp_path / "data", files=3, records_per_file=2)
    metrics_port = free_port()
    proc = start_master("--input", str(tmp_path / "data"), "--metrics-port", str(metrics_port))
    await wait_serving(proc.address, process=proc)
    async with grpc.aio.insecure_channel(proc.address) as channel:
        master = stub(channel)
        session = (await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="w0"))).session_id
        task = (await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=0))).task
        yield proc, master, session, task, metrics_port


async def test_grpcurl_lists_describes_and_calls_without_a_proto(busy_master):
    proc, _, _, task, _ = busy_master
    services = grpcurl(proc.address, "list").split()
    assert "paddlecloud.master.v1.Master" in services
    assert "grpc.health.v1.Health" in services
    described = grpcurl(proc.address, "describe", "paddlecloud.master.v1.Master")
    for rpc in ("RegisterTrainer", "GetTask", "TaskFinished", "ListTasks", "RequestSaveModel"):
        assert f"rpc {rpc}" in described
    status = json.loads(grpcurl(proc.address, "paddlecloud.master.v1.Master/GetStatus", data="{}"))
    assert status["phase"] == "Running" and status["num_tasks"] == "3"
    assert status["counts"]["pending"] == "1" and status["trainers_alive"] == 1
    listed = json.loads(grpcurl(proc.address, "paddlecloud.master.v1.Master/ListTasks",
                                data='{"state": "PENDING"}'))
    assert [(t["id"], t["holder"], t["attempt"]) for t in listed["tasks"]] == \
        [(str(task.id), "w0", str(task.attempt))]
    health = json.loads(grpcurl(proc.address, "grpc.health.v1.Health/Check"))
    assert health["status"] == "SERVING"


async def test_list_trainers_shows_sessions_and_held_tasks(busy_master):
    _, master, session, task, _ = busy_master
    reply = await master.ListTrainers(pb.ListTrainersRequest())
    assert [(t.trainer_id, t.session_id, list(t.tasks_held)) for t in reply.trainers] == \
        [("w0", session, [task.id])]


async def test_metrics_endpoint_serves_task_counts_and_rpc_latency(busy_master):
    _, master, session, task, port = busy_master
    await master.TaskFinished(pb.TaskReport(session_id=session, task_id=task.id, epoch=0, attempt=task.attempt))

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            return reply.read().decode()
    await wait_for(lambda: 'paddlecloud_master_tasks{state="done"} 1.0' in scrape(), timeout=30)
    text = scrape()
    assert "paddlecloud_master_dispatches_total 1.0" in text
    assert "paddlecloud_master_finishes_total 1.0" in text
    assert 'paddlecloud_master_tasks{state="todo"} 2.0' in text
    assert "paddlecloud_master_sessions_alive 1.0" in text
    assert 'paddlecloud_master_rpc_duration_seconds_count{method="GetTask"} 1.0' in text
    assert "paddlecloud_master_is_leader 1.0" in text
