"""The `unit` tier's rule: a test marked `unit` (`pytestmark = pytest.mark.unit`) is pure: no
etcd, no subprocess, no socket (a loopback one included), no gRPC channel or server.
`pytest -m unit` (`make unit`) runs that tier alone, the inner loop. The rule is enforced, not
trusted: tests/conftest.py applies `keep_pure` to every unit test, so one that starts a process
or opens a socket fails with what it tried."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess

import grpc
import grpc.aio


class NotAUnitTest(AssertionError):
    """A `unit` test reached for a process or the network."""


def _forbidden(what: str, *, method: bool = False):
    def refuse(*args, **kwargs):
        shown = args[1:] if method else args  # not the half-made object itself
        raise NotAUnitTest(f"a unit test may not {what} (args {str(shown)[:80]}): "
                           "drop its `unit` mark, or make it pure")
    return refuse


def keep_pure(request, monkeypatch) -> None:
    """Shuts a `unit` test's doors to processes, sockets, gRPC and the shared etcd."""
    monkeypatch.setattr(subprocess.Popen, "__init__", _forbidden("start a process", method=True))
    monkeypatch.setattr(os, "fork", _forbidden("fork"))
    monkeypatch.setattr(socket.socket, "connect", _forbidden("connect a socket", method=True))
    monkeypatch.setattr(socket.socket, "bind", _forbidden("bind a socket", method=True))
    monkeypatch.setattr(asyncio, "create_subprocess_exec", _forbidden("start a process"))
    # gRPC's sockets are its C core's, out of the socket module's sight: its doors are shut here
    for module in (grpc, grpc.aio):
        for name in ("insecure_channel", "secure_channel", "server"):
            monkeypatch.setattr(module, name, _forbidden(f"open gRPC's {name}"))
    for fixture in ("etcd_server", "etcd_endpoint"):
        if fixture in request.fixturenames:
            raise NotAUnitTest(f"a unit test may not use the {fixture} fixture")
