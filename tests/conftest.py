"""Shared fixtures: one real etcd server per test session, a unique job per test."""

from __future__ import annotations

import itertools
import os
import uuid

import pytest

from paddlecloud.etcd_server import EtcdServer


@pytest.fixture(scope="session")
def etcd_server():
    """A real etcd on a free loopback port in a temp dir, for the whole session."""
    server = EtcdServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def etcd_endpoint(etcd_server) -> str:
    return etcd_server.endpoint


_counter = itertools.count()


@pytest.fixture
def job_name(request) -> str:
    """A job name no other test uses, so tests sharing the etcd never see each other's keys."""
    base = request.node.name.lower().replace("_", "-")[:30].strip("-")
    return f"{base}-{os.getpid()}-{next(_counter)}-{uuid.uuid4().hex[:4]}"


@pytest.fixture
def start_master(tmp_path, etcd_endpoint, job_name):
    """Starts real `paddlecloud master` processes for this test's job; stops them after."""
    from masters import MasterProcess

    started = []

    def start(*args: str, job: str | None = None, name: str = "master", port: int | None = None):
        master = MasterProcess(job=job or job_name, etcd=etcd_endpoint, tmp=tmp_path, args=args,
                               name=name, port=port).start()
        started.append(master)
        return master

    yield start
    for master in started:
        master.stop()


@pytest.fixture
def start_trainer(tmp_path):
    """Starts stub trainer processes; kills any still running after the test."""
    from trainers import StubTrainer

    started = []

    def start(trainer_id: str, **kwargs):
        trainer = StubTrainer(trainer_id=trainer_id, tmp=tmp_path, **kwargs).start()
        started.append(trainer)
        return trainer

    yield start
    for trainer in started:
        trainer.stop()


@pytest.fixture
def local_run(tmp_path, job_name):
    """Starts `paddlecloud local train` runs (tests/local_runs.py); stops them after the test."""
    from local_runs import LocalRun

    runs = []

    def start(*args: str):
        runs.append(LocalRun(tmp_path, job_name, *args))
        return runs[-1]

    yield start
    for run in runs:
        run.stop()
