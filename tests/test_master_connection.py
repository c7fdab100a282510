"""A trainer's connection to a master that is slow or silent: the deadline of one call, and
the keep-alive pings that tell a master gone silent from one that is only busy.

A real server in a process of its own (`hold_server.py`) holds every GetTask, as a master
with thousands of calls queued ahead would; SIGSTOP makes it silent, as a lost node would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

import paddlecloud.auth
from master.server import SERVER_OPTIONS
from paddlecloud.api import pb, pb_grpc
from paddlecloud.auth import ClientCredentials
from paddlecloud.master_client.discovery import MasterLocator
from paddlecloud.wire import (
    KEEPALIVE_TIME_MS,
    MIN_PING_INTERVAL_MS,
    SERVER_KEEPALIVE,
    client_keepalive,
)
from trainer_agent.client import MasterConnection, MasterUnavailable

HOLD_SERVER = Path(__file__).with_name("hold_server.py")
FAST_PINGS = client_keepalive(time_ms=MIN_PING_INTERVAL_MS, timeout_ms=1_000)  # a test's seconds


@pytest.fixture
def hold_server() -> Iterator:
    started: list[subprocess.Popen] = []

    def start(*args: str) -> tuple[subprocess.Popen, str]:
        process = subprocess.Popen([sys.executable, str(HOLD_SERVER), *args], stdout=subprocess.PIPE, text=True)
        started.append(process)
        return process, f"127.0.0.1:{int(process.stdout.readline())}"

    yield start
    for process in started:
        process.kill()
        process.wait()


def held_call(address: str, *, timeout: float) -> grpc.RpcError:
    """A GetTask on a trainer's channel (`ClientCredentials.channel`) that the server holds."""
    with ClientCredentials().channel(address) as channel:
        stub = pb_grpc.MasterStub(channel)
        stub.GetStatus(pb.GetStatusRequest(), timeout=10)  # connected
        with pytest.raises(grpc.RpcError) as error:
            stub.GetTask(pb.GetTaskRequest(), timeout=timeout)
        return error.value


def test_the_master_accepts_the_pings_of_a_call_waiting_in_its_queue(hold_server, monkeypatch):
    monkeypatch.setattr(paddlecloud.auth, "CLIENT_KEEPALIVE", FAST_PINGS)
    assert set(SERVER_KEEPALIVE) <= set(SERVER_OPTIONS) and MIN_PING_INTERVAL_MS <= KEEPALIVE_TIME_MS
    _, address = hold_server()
    # Pinged every second for 6 s, held all along: it ends at its own deadline, nothing sooner.
    assert held_call(address, timeout=6).code() is grpc.StatusCode.DEADLINE_EXCEEDED
    # gRPC's default server sends such a client GOAWAY: what the master's options prevent.
    _, defaults = hold_server("--default-options")
    refused = held_call(defaults, timeout=6)
    assert refused.code() is grpc.StatusCode.UNAVAILABLE and "ping" in refused.details().lower()


def test_a_master_gone_silent_is_noticed_by_its_unanswered_pings_not_at_the_deadline(hold_server,
                                                                                     monkeypatch):
    monkeypatch.setattr(paddlecloud.auth, "CLIENT_KEEPALIVE", FAST_PINGS)
    process, address = hold_server()
    with ClientCredentials().channel(address) as channel:
        stub = pb_grpc.MasterStub(channel)
        stub.GetStatus(pb.GetStatusRequest(), timeout=10)
        os.kill(process.pid, signal.SIGSTOP)  # the connection stays open; nothing answers
        try:
            with pytest.raises(grpc.RpcError) as error:
                stub.GetTask(pb.GetTaskRequest(), timeout=30)  # gRPC alone waits 60 s for an ack
        finally:
            os.kill(process.pid, signal.SIGCONT)
    assert error.value.code() is grpc.StatusCode.UNAVAILABLE, error.value.details()
    assert "ping" in error.value.details().lower()


@pytest.mark.timeout(40)  # an attempt that ignored the connection's deadline would wait 60 s
def test_no_attempt_of_a_call_outlasts_the_connection_s_deadline(hold_server):
    _, address = hold_server()
    connection = MasterConnection(MasterLocator(master_endpoint=address), deadline=3)
    try:
        with pytest.raises(MasterUnavailable, match="for 3s"):
            connection.get_task(1, epoch=0, finished=[])
    finally:
        connection.close()
