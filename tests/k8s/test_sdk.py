"""The Python API: PaddleJob validated when made; dist_train submits to a real Job Server (uvicorn
on loopback, kmock behind it) when PADDLE_NOTEBOOK=YES, and trains locally otherwise."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import uvicorn

from job_server.app import create_app
from job_server.config import ServerConfig
from paddlecloud import PaddleJob, dist_train
from paddlecloud.etcd_server import free_port
from paddlecloud.jobspec import JobSpecError
from paddlecloud.sdk import JobHandle


def test_a_bad_value_is_refused_at_construction_naming_it():
    with pytest.raises(JobSpecError, match="'lots'"):
        PaddleJob(job_name="fit", module="fit.train", memory="lots")
    with pytest.raises(JobSpecError, match="'Fit!'"):
        PaddleJob(job_name="Fit!", module="fit.train")


async def test_dist_train_in_a_notebook_submits_and_the_handle_reads_status(
        k8s, api_client, tmp_path, monkeypatch):
    package = tmp_path / "fit"
    package.mkdir()
    (package / "train.py").write_text("print('fit')\n")
    config = ServerConfig(store=str(tmp_path / "store"), tokens={"tok": ("team-a",)})
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(config, api_client=api_client),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        await k8s.wait_for(lambda: server.started, what="uvicorn started")
        monkeypatch.setenv("PADDLE_NOTEBOOK", "YES")
        job = PaddleJob(job_name="fit", module="placeholder", trainer_package=str(package),
                        input=("/data/*.csv",), pservers=1, trainers=2)
        handle = await asyncio.to_thread(dist_train, "train", paddle_job=job,
                                         server=f"http://127.0.0.1:{port}", token="tok")
        assert isinstance(handle, JobHandle) and handle.namespace == "team-a"
        assert k8s.stored("configmaps", "team-a", "fit-package")["data"]["train.py"] == "print('fit')\n"
        status = await asyncio.to_thread(handle.status)
        assert status["name"] == "fit" and status["phase"] == "Pending"
        assert set(status["pods"]) == {"trainer", "pserver", "master"}
        assert "deployments/fit-master" in await asyncio.to_thread(handle.delete)
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join, 10)


def test_dist_train_without_a_notebook_trains_here(tmp_path, monkeypatch):
    monkeypatch.delenv("PADDLE_NOTEBOOK", raising=False)
    data = tmp_path / "data.csv"
    data.write_text("".join(f"{i},{2 * i}\n" for i in range(40)))
    job = PaddleJob(job_name="stub-local", module="placeholder", input=(str(data),),
                    output=str(tmp_path / "out"), trainers=1)
    assert dist_train("trainer_agent.stub", paddle_job=job) == 0
    assert (Path(tmp_path / "out" / "logs") / "trainer-0.log").exists()
