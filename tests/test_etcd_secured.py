"""etcd with TLS, client certificates and auth (the real etcd binary; certificates made with
`cryptography` for the test): the master, the pserver agent and `job delete` work through
it, and wrong credentials end a master with one clear line instead of retrying forever.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from aetcd import rpc
from datasets import write_records
from masters import MasterProcess, pb, stub, wait_serving
from test_pserver_agent import ask
from waiting import wait_for

from paddlecloud.cli.jobs import clear_etcd_prefix
from paddlecloud.etcd import (
    PLAINTEXT_PASSWORD_ENV,
    EtcdAuthError,
    EtcdCredentials,
    EtcdUnavailable,
    connect,
)
from paddlecloud.etcd_server import EtcdServer, EtcdTls
from paddlecloud.keys import JobKeys, prefix_range_end
from paddlecloud.tls import LocalCA

PASSWORD = "s3cret-etcd-password"
REPO = Path(__file__).resolve().parent.parent


async def _enable_auth(endpoint: str, credentials: EtcdCredentials) -> None:
    client = await connect(endpoint, credentials=credentials)
    try:
        auth = rpc.AuthStub(client.channel)
        await auth.RoleAdd(rpc.AuthRoleAddRequest(name="root"))
        await auth.UserAdd(rpc.AuthUserAddRequest(name="root", password=PASSWORD))
        await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"))
        await auth.AuthEnable(rpc.AuthEnableRequest())
    finally:
        await client.close()


def _certificates(d, name: str):
    """A new CA (its certificate in d/ca.crt) and the (server, client) certificates it issued."""
    ca = LocalCA.create(name)
    ca.write_cert(d / "ca.crt")
    return ca.issue(d, "server", hosts=("127.0.0.1", "localhost")), ca.issue(d, "client", hosts=(), client=True)


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """(etcd, the environment of a process that may use it)."""
    d = tmp_path_factory.mktemp("etcd-tls")
    server, client = _certificates(d, "etcd test CA")
    (d / "password").write_text(PASSWORD + "\n")
    tls = EtcdTls(ca=str(d / "ca.crt"), cert=str(server.cert), key=str(server.key),
                  client_cert=str(client.cert), client_key=str(client.key))
    with EtcdServer(tls=tls) as etcd:
        certificates = EtcdCredentials(ca_file=tls.ca, cert_file=tls.client_cert, key_file=tls.client_key)
        asyncio.run(_enable_auth(etcd.endpoint, certificates))
        env = {"PADDLE_ETCD_ENDPOINTS": etcd.endpoint, "PADDLE_ETCD_CA_FILE": tls.ca,
               "PADDLE_ETCD_CERT_FILE": tls.client_cert, "PADDLE_ETCD_KEY_FILE": tls.client_key,
               "PADDLE_ETCD_USER": "root", "PADDLE_ETCD_PASSWORD_FILE": str(d / "password")}
        yield etcd, env


def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "POD_", "PADDLECLOUD_"))}
    return dict(base, PYTHONUNBUFFERED="1", **extra)


async def _keys(env: dict[str, str], prefix: bytes) -> dict[bytes, bytes]:
    client = await connect(env["PADDLE_ETCD_ENDPOINTS"], credentials=EtcdCredentials.from_env(env))
    try:
        return {kv.key: kv.value for kv in
                (await client.kvstub.Range(rpc.RangeRequest(key=prefix, range_end=prefix_range_end(prefix)),
                                           metadata=client.metadata)).kvs}
    finally:
        await client.close()


async def test_master_and_job_delete_work_through_tls_and_auth(secured, tmp_path, job_name, monkeypatch):
    etcd, env = secured
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    write_records(tmp_path / "data", files=2, records_per_file=3)
    proc = MasterProcess(job=job_name, etcd=etcd.endpoint, tmp=tmp_path,
                         args=("--input", str(tmp_path / "data"))).start()
    try:
        await wait_serving(proc.address, process=proc)
        async with grpc.aio.insecure_channel(proc.address) as channel:
            m = stub(channel)
            session = (await m.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="t"))).session_id
            # refreshed by the master's lease process, which must log in as the master does
            await m.KeepAlive(pb.KeepAliveRequest(session_id=session), timeout=30)
            task = (await m.GetTask(pb.GetTaskRequest(session_id=session, epoch=0))).task
            reply = await m.TaskFinished(pb.TaskReport(session_id=session, task_id=task.id, epoch=0,
                                                       attempt=task.attempt))
            assert reply.result == pb.ACCEPTED
    finally:
        proc.stop()
    keys = JobKeys("local", job_name)
    assert keys.done(0, task.id) in await _keys(env, keys.prefix)
    # `job delete`'s etcd step, with the same credentials from the environment
    assert await clear_etcd_prefix(etcd.endpoint, namespace="local", job_name=job_name, timeout=10) > 0
    assert await _keys(env, keys.prefix) == {}


def _start_agent(env: dict[str, str], tmp_path: Path, job_name: str) -> subprocess.Popen:
    with open(tmp_path / "agent.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "paddlecloud", "pserver", "--lease-ttl", "2s", "--",
             sys.executable, "-m", "pserver_agent.stub"],
            env=_clean_env({**env, "PADDLE_JOB_NAME": job_name, "PADDLE_PSERVERS_NUM": "1",
                            "PADDLECLOUD_STUB_LOG": str(tmp_path / "stub.jsonl")}),
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO)


async def test_pserver_agent_registers_through_tls_and_auth(secured, tmp_path, job_name):
    etcd, env = secured
    agent = _start_agent(env, tmp_path, job_name)
    try:
        keys = JobKeys("local", job_name)

        async def registered() -> bool:
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()
            return bool(await _keys(env, keys.kind_prefix("pservers")))
        await wait_for(registered, timeout=60, details=lambda: (tmp_path / "agent.log").read_text())
        endpoint = next(iter((await _keys(env, keys.kind_prefix("pservers"))).values())).decode()

        async def pserver_env() -> dict | None:
            try:
                return await asyncio.to_thread(ask, endpoint)
            except OSError:
                return None
        seen = (await wait_for(pserver_env, timeout=60))["env"]
        assert seen["PADDLE_ETCD_CA_FILE"] == env["PADDLE_ETCD_CA_FILE"]
        assert not {"PADDLE_ETCD_USER", "PADDLE_ETCD_PASSWORD_FILE", "PADDLE_ETCD_KEY_FILE"} & set(seen)
    finally:
        agent.terminate()
        await asyncio.to_thread(agent.wait, 30)


@pytest.mark.parametrize("change, fragment", [
    ({"PADDLE_ETCD_PASSWORD_FILE": None, "PADDLE_ETCD_PASSWORD": "wrong"}, "refused our credentials"),
    ({"PADDLE_ETCD_USER": None, "PADDLE_ETCD_PASSWORD_FILE": None}, "refused our credentials"),
])
def test_wrong_etcd_credentials_end_the_master_with_one_line(secured, tmp_path, job_name, change, fragment):
    etcd, env = secured
    env = {k: v for k, v in {**env, **change}.items() if v is not None}
    result = subprocess.run(
        [sys.executable, "-m", "paddlecloud", "master", "--job", job_name, "--etcd-endpoints", etcd.endpoint,
         "--host", "127.0.0.1", "--port", "0"],
        env=_clean_env(env), capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert PASSWORD not in result.stderr


@pytest.fixture(scope="module")
def tls_only(tmp_path_factory):
    """(etcd serving TLS to any client, no client certificate or user asked; its CA file)."""
    d = tmp_path_factory.mktemp("etcd-tls-only")
    server, client = _certificates(d, "etcd discovery test CA")  # client: the health check's only
    tls = EtcdTls(ca=str(d / "ca.crt"), cert=str(server.cert), key=str(server.key),
                  client_cert=str(client.cert), client_key=str(client.key), client_cert_auth=False)
    with EtcdServer(tls=tls) as etcd:
        yield etcd, tls.ca


def test_trainers_find_the_leader_over_tls_with_a_ca_only(tls_only, tmp_path, job_name, monkeypatch):
    """A real master publishes its address in the https:// etcd; a trainer's locator reads it
    with the CA alone (no etcd user, no client certificate), and trusts no other CA."""
    from paddlecloud.master_client.discovery import DiscoveryError, MasterLocator

    etcd, ca_file = tls_only
    monkeypatch.setenv("PADDLE_ETCD_CA_FILE", ca_file)  # the master's (and only that)
    write_records(tmp_path / "data", files=1, records_per_file=2)
    proc = MasterProcess(job=job_name, etcd=etcd.endpoint, tmp=tmp_path,
                         args=("--input", str(tmp_path / "data"))).start()
    try:
        asyncio.run(wait_serving(proc.address, process=proc))
        trainer_env = {"PADDLE_ETCD_ENDPOINTS": etcd.endpoint, "PADDLE_JOB_NAME": job_name,
                       "PADDLE_ETCD_CA_FILE": ca_file}
        assert not {"PADDLE_ETCD_USER", "PADDLE_ETCD_CERT_FILE"} & set(trainer_env)
        assert MasterLocator.from_env(trainer_env).resolve(timeout=5) == proc.address
        other = LocalCA.create("someone else's CA").write_cert(tmp_path / "other.crt")
        with pytest.raises(DiscoveryError, match="not trusted"):  # an impostor etcd is not believed
            MasterLocator.from_env({**trainer_env, "PADDLE_ETCD_CA_FILE": str(other)}).resolve(timeout=5)
        with pytest.raises(DiscoveryError, match="cannot read PADDLE_ETCD_CA_FILE"):
            MasterLocator.from_env({**trainer_env, "PADDLE_ETCD_CA_FILE": str(tmp_path / "none")}).resolve()
    finally:
        proc.stop()


def test_an_etcd_asking_for_credentials_tells_trainers_to_use_the_master_endpoint(secured, job_name):
    from paddlecloud.master_client.discovery import DiscoveryError, MasterLocator

    etcd, env = secured
    locator = MasterLocator.from_env({"PADDLE_ETCD_ENDPOINTS": etcd.endpoint, "PADDLE_JOB_NAME": job_name,
                                      "PADDLE_ETCD_CA_FILE": env["PADDLE_ETCD_CA_FILE"]})
    with pytest.raises(DiscoveryError, match="trainers have none: set PADDLE_MASTER_ENDPOINT"):
        locator.resolve(timeout=5)


async def test_a_client_keeps_working_past_the_auth_token_ttl(monkeypatch):
    """etcd's simple tokens expire after --auth-token-ttl without use, and aetcd logs in only at
    connect: our client logs in again on "invalid auth token" and retries once, so a client (a
    standby master) idle past the TTL still reads and writes.

    The idle time is the stimulus, not a wait for something to settle: every use of a token
    renews it, so no condition can be polled to see it expire; etcd's log then shows that the
    first token was refused, i.e. that the renewal really ran."""
    ttl = 2
    monkeypatch.setenv(PLAINTEXT_PASSWORD_ENV, "1")  # auth without TLS: a loopback etcd
    with EtcdServer(extra_args=("--auth-token-ttl", str(ttl))) as etcd:
        await _enable_auth(etcd.endpoint, EtcdCredentials())
        client = await connect(etcd.endpoint, credentials=EtcdCredentials(user="root", password=PASSWORD))
        try:
            first = dict(client.metadata)["token"]
            await client.put(b"/paddlecloud/ttl/a", b"1")
            await asyncio.sleep(ttl + 1.5)  # idle past the TTL: the token expires
            assert (await client.get(b"/paddlecloud/ttl/a")).value == b"1"
            await client.put(b"/paddlecloud/ttl/b", b"2")
            assert dict(client.metadata)["token"] != first
            log = await asyncio.to_thread(Path(etcd.log_path).read_text)
            # it did expire, and was refused once: etcd 3.4 logs text, 3.5 JSON
            refused = (f"invalid auth token: {first}", f'"msg":"invalid auth token","token":"{first}"')
            assert any(line in log for line in refused), log[-2000:]
        finally:
            await client.close()


async def test_a_watch_opened_after_the_token_was_renewed_presents_the_new_one(monkeypatch):
    """aetcd's watcher opens its stream with the metadata it was built with: a watch that
    starts after a renewal must present the renewed token (paddlecloud/etcd/aetcd_client.py
    shares one AuthToken with it), or etcd refuses it. Idle past the TTL as above."""
    ttl = 2
    monkeypatch.setenv(PLAINTEXT_PASSWORD_ENV, "1")  # auth without TLS: a loopback etcd
    with EtcdServer(extra_args=("--auth-token-ttl", str(ttl))) as etcd:
        await _enable_auth(etcd.endpoint, EtcdCredentials())
        client = await connect(etcd.endpoint, credentials=EtcdCredentials(user="root", password=PASSWORD))
        key = b"/paddlecloud/ttl/watched"
        try:
            first = dict(client.metadata)["token"]
            await asyncio.sleep(ttl + 1.5)  # idle past the TTL: the token expires
            await client.put(key, b"0")  # refused once, logs in again
            assert dict(client.metadata)["token"] != first
            watch = await asyncio.wait_for(client.watch(key), 10)
            await client.put(key, b"1")

            async def first_value() -> bytes:
                async for event in watch:
                    return event.kv.value

            assert await asyncio.wait_for(first_value(), 10) == b"1"
        finally:
            await client.close()


async def test_a_master_keeps_serving_past_the_auth_token_ttl(tmp_path, job_name, monkeypatch):
    """A master on an etcd with auth and a 2 s token TTL: trainers work with it before and
    after its first token expired (its election, its writes, its reads)."""
    (tmp_path / "password").write_text(PASSWORD + "\n")
    with EtcdServer(extra_args=("--auth-token-ttl", "2")) as etcd:
        await _enable_auth(etcd.endpoint, EtcdCredentials())
        monkeypatch.setenv("PADDLE_ETCD_USER", "root")
        monkeypatch.setenv(PLAINTEXT_PASSWORD_ENV, "1")  # auth without TLS: a loopback etcd
        monkeypatch.setenv("PADDLE_ETCD_PASSWORD_FILE", str(tmp_path / "password"))
        write_records(tmp_path / "data", files=4, records_per_file=3)
        proc = MasterProcess(job=job_name, etcd=etcd.endpoint, tmp=tmp_path,
                             args=("--input", str(tmp_path / "data"), "--session-ttl", "30s")).start()
        try:
            await wait_serving(proc.address, process=proc)
            async with grpc.aio.insecure_channel(proc.address) as channel:
                m = stub(channel)
                for turn in range(2):
                    session = (await m.RegisterTrainer(pb.RegisterTrainerRequest(
                        trainer_id=f"t{turn}"))).session_id
                    task = (await m.GetTask(pb.GetTaskRequest(session_id=session, epoch=0))).task
                    reply = await m.TaskFinished(pb.TaskReport(session_id=session, task_id=task.id,
                                                               epoch=0, attempt=task.attempt))
                    assert reply.result == pb.ACCEPTED, turn
                    if turn == 0:
                        # the stimulus: longer than the token TTL, and than the master's goodput
                        # writes (master.goodput.PERSIST_EVERY, 5 s) are apart, so that the token
                        # lies unused for a whole TTL between two of them
                        await asyncio.sleep(5.5)
            log = await asyncio.to_thread(Path(etcd.log_path).read_text)
            assert "invalid auth token" in log  # the first token did expire
            assert proc.process.poll() is None, proc.log()
        finally:
            proc.stop()


class _PlaintextListener:
    """A fake etcd on loopback: accepts TCP connections, opens HTTP/2 as a server does (an
    empty SETTINGS frame, then the ack of the client's: gRPC sends no call before both) and
    keeps every byte they send, answering no call. A password sent in plaintext would be
    among those bytes."""

    SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # length 0, type SETTINGS, no flags, stream 0
    SETTINGS_ACK = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"

    def __init__(self) -> None:
        import socket
        import threading

        self._socket = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self.received = bytearray()
        self.connections = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._keep, args=(connection,), daemon=True).start()

    def _keep(self, connection) -> None:
        with connection:
            connection.sendall(self.SETTINGS + self.SETTINGS_ACK)
            while data := connection.recv(65536):
                with self._lock:
                    self.received += data

    def close(self) -> None:
        self._socket.close()


@pytest.fixture
def plaintext_etcd():
    listener = _PlaintextListener()
    yield listener
    listener.close()


def _password_env(tmp_path: Path, endpoint: str) -> dict[str, str]:
    (tmp_path / "password").write_text(PASSWORD + "\n")
    return {"PADDLE_ETCD_ENDPOINTS": endpoint, "PADDLE_ETCD_USER": "root",
            "PADDLE_ETCD_PASSWORD_FILE": str(tmp_path / "password")}


def test_master_and_pserver_agent_refuse_to_send_a_password_to_http_etcd(plaintext_etcd, tmp_path, job_name):
    env = _clean_env(_password_env(tmp_path, plaintext_etcd.endpoint))
    commands = {
        "master": [sys.executable, "-m", "paddlecloud", "master", "--job", job_name, "--etcd-endpoints",
                   plaintext_etcd.endpoint, "--host", "127.0.0.1", "--port", "0"],
        "pserver agent": [sys.executable, "-m", "paddlecloud", "pserver", "--", sys.executable, "-c", "pass"],
    }
    for name, command in commands.items():
        result = subprocess.run(command, env=dict(env, PADDLE_JOB_NAME=job_name, PADDLE_PSERVERS_NUM="1"),
                                capture_output=True, text=True, timeout=60, cwd=REPO)
        assert result.returncode == 1, (name, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "refusing to send the password of etcd user 'root'" in lines[0], (name, lines)
        assert plaintext_etcd.endpoint in result.stderr, (name, result.stderr)
        assert "PADDLE_ETCD_ALLOW_PLAINTEXT_PASSWORD=1" in result.stderr, (name, result.stderr)
    assert plaintext_etcd.connections == 0 and PASSWORD.encode() not in plaintext_etcd.received


async def test_job_delete_refuses_to_send_a_password_to_http_etcd(plaintext_etcd, tmp_path, monkeypatch):
    for key, value in _password_env(tmp_path, plaintext_etcd.endpoint).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv(PLAINTEXT_PASSWORD_ENV, raising=False)
    with pytest.raises(EtcdAuthError, match="in plaintext to http://127.0.0.1:"):
        await clear_etcd_prefix(plaintext_etcd.endpoint, namespace="local", job_name="j", timeout=5)
    assert plaintext_etcd.connections == 0
    # the control: with the explicit opt-in the password does go out, readable by the listener
    monkeypatch.setenv(PLAINTEXT_PASSWORD_ENV, "1")
    with pytest.raises(EtcdUnavailable):
        await connect(plaintext_etcd.endpoint, timeout=3)
    assert PASSWORD.encode() in plaintext_etcd.received
