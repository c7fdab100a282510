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
