"""`python -m paddlecloud.backends.k8s.portwatch`: the helper beside images without paddlecloud.

Real sockets and real processes: `--wait` returns once every endpoint listens (the
trainers' start order), `--hold` runs while one listens and exits 1 when it stops
(the pserver agent's registration lives as long as that).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from paddlecloud.backends.k8s.portwatch import parse_endpoints

COMMAND = [sys.executable, "-m", "paddlecloud.backends.k8s.portwatch"]


def listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_exit(process: subprocess.Popen, timeout: float = 30.0) -> int:
    return process.wait(timeout=timeout)


def test_wait_returns_only_once_every_endpoint_listens():
    first = listener()
    late = free_port()
    process = subprocess.Popen([*COMMAND, "--wait", f"127.0.0.1:{first.getsockname()[1]},127.0.0.1:{late}",
                                "--interval", "0.1"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        line = ""
        while f"127.0.0.1:{late}" not in line:  # it says what it still waits for
            line = process.stderr.readline()
            assert time.monotonic() < deadline and line, "portwatch never reported waiting"
        assert process.poll() is None
        second = socket.socket()
        second.bind(("127.0.0.1", late))
        second.listen(16)
        assert wait_exit(process) == 0
        second.close()
    finally:
        process.kill()
        first.close()


def test_wait_gives_up_after_its_timeout():
    started = time.monotonic()
    result = subprocess.run([*COMMAND, "--wait", f"127.0.0.1:{free_port()}", "--interval", "0.1",
                             "--timeout", "0.5"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "still not listening" in result.stderr
    assert time.monotonic() - started < 20


def test_hold_runs_while_the_port_listens_and_exits_1_when_it_stops():
    server = listener()
    port = server.getsockname()[1]
    process = subprocess.Popen([*COMMAND, "--hold", f"127.0.0.1:{port}", "--interval", "0.1",
                                "--failures", "2"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        line = ""
        while "holding" not in line:
            line = process.stderr.readline()
            assert time.monotonic() < deadline and line, "portwatch never started holding"
        assert process.poll() is None
        server.close()
        assert wait_exit(process) == 1
    finally:
        process.kill()


@pytest.mark.parametrize("text", ["nohost", "h:0", "h:99999", ":80", "h:x"])
def test_a_bad_endpoint_is_refused_by_name(text):
    with pytest.raises(ValueError, match=repr(text)):
        parse_endpoints(text)
    result = subprocess.run([*COMMAND, "--wait", text], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and repr(text) in result.stderr
