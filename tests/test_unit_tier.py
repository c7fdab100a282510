"""The `unit` tier's rule holds: a test marked `unit` cannot start a process or open a socket."""

from __future__ import annotations

import asyncio
import socket
import subprocess

import grpc
import pytest

from tests.unit_tier import NotAUnitTest

pytestmark = pytest.mark.unit


def test_a_unit_test_cannot_start_a_process():
    with pytest.raises(NotAUnitTest, match="start a process"):
        subprocess.run(["true"], check=False)
    with pytest.raises(NotAUnitTest, match="start a process"):
        asyncio.run(asyncio.create_subprocess_exec("true"))


def test_a_unit_test_cannot_open_a_socket_or_a_grpc_channel():
    with socket.socket() as sock, pytest.raises(NotAUnitTest, match="connect a socket"):
        sock.connect(("127.0.0.1", 9))
    with socket.socket() as sock, pytest.raises(NotAUnitTest, match="bind a socket"):
        sock.bind(("127.0.0.1", 0))
    with pytest.raises(NotAUnitTest, match="insecure_channel"):
        grpc.insecure_channel("127.0.0.1:9")
    with pytest.raises(NotAUnitTest, match="server"):
        grpc.aio.server()


def test_the_unit_tier_is_large_enough_to_be_the_inner_loop(request):
    units = [item for item in request.session.items if item.get_closest_marker("unit")]
    if len(request.session.items) < 1000:  # a run of a few files: nothing to judge
        pytest.skip("run with the whole suite or `-m unit` collected")
    assert len(units) >= 400, f"only {len(units)} unit tests"
