"""mTLS on a master: `--tls-client-ca` makes the TLS handshake itself demand a client
certificate signed by that CA, before any token is looked at; the trainer library presents
one from PADDLE_MASTER_CERT_FILE / PADDLE_MASTER_KEY_FILE.

Real master processes with real TLS (certificates from `paddlecloud.tls.LocalCA`), real
gRPC channels, a real etcd; the stub trainer is a real `trainer_agent` process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from datasets import write_records
from grpc_health.v1 import health_pb2, health_pb2_grpc
from masters import MasterProcess, pb, wait_until
from trainers import read_log

from paddlecloud.api import pb_grpc
from paddlecloud.auth import ClientCredentials, CredentialError, JobTokens, auth_metadata
from paddlecloud.tls import Issued, LocalCA
from trainer_agent.client import MasterUnavailable, TaskClient

FILES, RECORDS = 3, 4


@dataclass
class MutualMaster:
    proc: MasterProcess
    tokens: JobTokens
    tokens_dir: Path
    server_ca: Path    # what clients trust (PADDLE_MASTER_CA_FILE)
    client: Issued     # a client certificate signed by the master's --tls-client-ca
    stranger: Issued   # a client certificate signed by another CA

    def credentials(self, *, cert: Issued | None, token: str | None) -> ClientCredentials:
        return ClientCredentials(token=token, ca=self.server_ca.read_bytes(),
                                 cert=cert.cert.read_bytes() if cert else None,
                                 key=cert.key.read_bytes() if cert else None)


def _status_code(credentials: ClientCredentials, address: str) -> grpc.StatusCode:
    with credentials.channel(address) as channel:
        try:
            pb_grpc.MasterStub(channel).GetStatus(pb.GetStatusRequest(), metadata=credentials.metadata(),
                                                  timeout=10)
        except grpc.RpcError as error:
            return error.code()
    return grpc.StatusCode.OK


@pytest.fixture
def mutual(tmp_path, start_master) -> MutualMaster:
    """A master with tokens, TLS, and --tls-client-ca: the server's CA and the clients' CA
    are two CAs, and a third signs a certificate the master must not accept."""
    certs = tmp_path / "certs"
    server_ca, client_ca, other_ca = (LocalCA.create(name) for name in ("server CA", "client CA", "other CA"))
    server = server_ca.issue(certs, "master", hosts=("127.0.0.1", "localhost"))
    client = client_ca.issue(certs, "trainer", hosts=(), client=True)
    stranger = other_ca.issue(certs, "stranger", hosts=(), client=True)
    server_ca_path = server_ca.write_cert(certs / "server-ca.crt")
    client_ca_path = client_ca.write_cert(certs / "client-ca.crt")
    tokens = JobTokens.generate()
    tokens_dir = tokens.write(tmp_path / "tokens")
    write_records(tmp_path / "data", files=FILES, records_per_file=RECORDS)
    proc = start_master("--input", str(tmp_path / "data"), "--epochs", "1", "--tokens-dir", str(tokens_dir),
                        "--tls-cert", str(server.cert), "--tls-key", str(server.key),
                        "--tls-client-ca", str(client_ca_path))
    m = MutualMaster(proc, tokens, tokens_dir, server_ca_path, client, stranger)
    good = m.credentials(cert=client, token=None)

    def serving() -> bool:
        if proc.process.poll() is not None:
            raise AssertionError(f"master exited with {proc.process.returncode}:\n{proc.log()}")
        with good.channel(proc.address) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
            except grpc.RpcError:
                return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING
    wait_until(serving, timeout=60, message="the mTLS master does not serve", details=proc.log)
    return m


def test_a_master_with_a_client_ca_refuses_clients_without_its_certificate(mutual):
    m = mutual
    operator = m.tokens.operator
    # the operator's token alone does not open the door: the handshake fails first
    assert _status_code(m.credentials(cert=None, token=operator), m.proc.address) == grpc.StatusCode.UNAVAILABLE
    assert _status_code(m.credentials(cert=m.stranger, token=operator),
                        m.proc.address) == grpc.StatusCode.UNAVAILABLE
    with grpc.insecure_channel(m.proc.address) as plaintext:
        try:
            pb_grpc.MasterStub(plaintext).GetStatus(pb.GetStatusRequest(), metadata=auth_metadata(operator),
                                                    timeout=10)
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE
        else:
            raise AssertionError("a plaintext call was answered")
    assert "Traceback" not in m.proc.log()


def test_a_master_with_a_client_ca_serves_a_client_with_its_certificate_and_a_token(mutual):
    m = mutual
    for token in (m.tokens.operator, m.tokens.viewer):
        credentials = m.credentials(cert=m.client, token=token)
        with credentials.channel(m.proc.address) as channel:
            status = pb_grpc.MasterStub(channel).GetStatus(pb.GetStatusRequest(), metadata=credentials.metadata(),
                                                           timeout=10)
        assert status.num_tasks == FILES and status.counts.todo == FILES
    # the certificate lets the client in; the tokens still decide what it may do
    assert _status_code(m.credentials(cert=m.client, token=None), m.proc.address) == grpc.StatusCode.UNAUTHENTICATED
    assert _status_code(m.credentials(cert=m.client, token=JobTokens.generate().operator),
                        m.proc.address) == grpc.StatusCode.UNAUTHENTICATED


def test_the_trainer_library_presents_the_certificate_named_by_the_environment(mutual, tmp_path, start_trainer):
    m = mutual
    env = {"PADDLE_MASTER_CA_FILE": str(m.server_ca), "PADDLE_MASTER_CERT_FILE": str(m.client.cert),
           "PADDLE_MASTER_KEY_FILE": str(m.client.key), "PADDLE_JOB_TOKEN_FILE": str(m.tokens_dir / "trainer")}
    log = tmp_path / "records.tsv"
    trainer = start_trainer("t0", master=m.proc.address, log=log, env=env)
    assert trainer.wait(timeout=120) == 0, trainer.output_text()
    records = [row[3] for row in read_log(log)]
    assert len(records) == FILES * RECORDS and len(set(records)) == FILES * RECORDS
    credentials = m.credentials(cert=m.client, token=m.tokens.viewer)
    with credentials.channel(m.proc.address) as channel:
        status = pb_grpc.MasterStub(channel).GetStatus(pb.GetStatusRequest(), metadata=credentials.metadata(),
                                                       timeout=10)
    assert status.counts.done == FILES


def test_the_trainer_library_without_a_client_certificate_is_refused(mutual, monkeypatch):
    m = mutual
    monkeypatch.setenv("PADDLE_MASTER_ENDPOINT", m.proc.address)
    monkeypatch.setenv("PADDLE_MASTER_CA_FILE", str(m.server_ca))
    monkeypatch.setenv("PADDLE_JOB_TOKEN_FILE", str(m.tokens_dir / "trainer"))
    for name in ("PADDLE_MASTER_CERT_FILE", "PADDLE_MASTER_KEY_FILE", "PADDLE_ETCD_ENDPOINTS"):
        monkeypatch.delenv(name, raising=False)
    client = TaskClient.from_env(trainer_id="uncertified", deadline=2)
    try:
        with pytest.raises(MasterUnavailable, match=m.proc.address):
            client.register()
    finally:
        client.close()
    # a certificate without its key (or the reverse) is named, not silently dropped
    monkeypatch.setenv("PADDLE_MASTER_CERT_FILE", str(m.client.cert))
    with pytest.raises(CredentialError, match="PADDLE_MASTER_CERT_FILE and PADDLE_MASTER_KEY_FILE go together"):
        ClientCredentials.from_env()
