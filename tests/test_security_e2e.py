"""End to end with TLS and tokens: `paddlecloud local train --tls` trains with stub trainers,
while a plaintext client, or a TLS client without the job's token, is refused.
"""

from __future__ import annotations

import asyncio

import grpc
from datasets import write_records
from local_runs import LocalRun, leader_of
from masters import pb, wait_until
from trainers import read_log, reads_per_epoch

from paddlecloud.api import pb_grpc
from paddlecloud.auth import ClientCredentials


def _code(channel: grpc.Channel, metadata=()) -> grpc.StatusCode:
    try:
        pb_grpc.MasterStub(channel).GetStatus(pb.GetStatusRequest(), timeout=5, metadata=metadata)
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def test_local_job_with_tls_and_tokens_trains_and_refuses_plaintext(tmp_path, job_name, etcd_endpoint):
    write_records(tmp_path / "data", files=4, records_per_file=40)
    run = LocalRun(tmp_path, job_name, "--module", "trainer_agent.stub", "--input", str(tmp_path / "data"),
                   "--trainers", "2", "--epochs", "2", "--chunk-bytes", "200", "--tls",
                   "--etcd-endpoints", etcd_endpoint, "--", "--delay", "0.02")
    try:
        wait_until(lambda: len(read_log(run.records)) >= 20, timeout=120, message="no progress",
                   details=run.text)
        leader = asyncio.run(leader_of(etcd_endpoint, job_name))
        assert leader
        secrets = run.output / ".paddlecloud"
        assert oct(secrets.stat().st_mode & 0o777) == "0o700"
        assert oct((secrets / "tokens" / "operator").stat().st_mode & 0o777) == "0o600"
        with grpc.insecure_channel(leader) as plaintext:
            assert _code(plaintext) == grpc.StatusCode.UNAVAILABLE  # no TLS: no handshake
        with_ca = ClientCredentials(ca=(secrets / "ca.crt").read_bytes())
        with with_ca.channel(leader) as channel:
            assert _code(channel) == grpc.StatusCode.UNAUTHENTICATED
            viewer = ClientCredentials(token=(secrets / "tokens" / "viewer").read_text().strip())
            assert _code(channel, viewer.metadata()) == grpc.StatusCode.OK
        assert run.wait() == 0, run.text()
    finally:
        run.stop()
    reads = reads_per_epoch(read_log(run.records))
    assert sorted(reads) == [0, 1] and all(len(set(c)) == 160 for c in reads.values())
    assert "INSECURE" not in (run.output / "logs" / "master-0.log").read_text()


def test_grpcurl_recipe_with_tls_and_a_token(tmp_path, start_master):
    """docs/master.md's recipe: `paddlecloud credentials`, then grpcurl with -cacert and the token."""
    import subprocess
    import sys

    from test_operator_tools import GRPCURL

    creds = tmp_path / "creds"
    subprocess.run([sys.executable, "-m", "paddlecloud", "credentials", str(creds), "--tls-host", "127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    write_records(tmp_path / "data", files=1, records_per_file=2)
    proc = start_master("--input", str(tmp_path / "data"), "--tokens-dir", str(creds / "tokens"),
                        "--tls-cert", str(creds / "master.crt"), "--tls-key", str(creds / "master.key"))

    def grpcurl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([GRPCURL, "-cacert", str(creds / "ca.crt"), *args], capture_output=True,
                              text=True, timeout=30)

    wait_until(lambda: grpcurl(proc.address, "grpc.health.v1.Health/Check").returncode == 0, timeout=60,
               details=proc.log)
    assert "paddlecloud.master.v1.Master" in grpcurl(proc.address, "list").stdout  # reflection: open
    operator = (creds / "tokens" / "operator").read_text().strip()
    ok = grpcurl("-H", f"authorization: Bearer {operator}", "-d", "{}", proc.address,
                 "paddlecloud.master.v1.Master/GetStatus")
    assert ok.returncode == 0 and '"num_tasks": "1"' in ok.stdout, ok.stderr
    refused = grpcurl("-d", "{}", proc.address, "paddlecloud.master.v1.Master/GetStatus")
    assert refused.returncode != 0 and "Unauthenticated" in refused.stderr
    plaintext = subprocess.run([GRPCURL, "-plaintext", proc.address, "list"], capture_output=True, text=True,
                               timeout=30)
    assert plaintext.returncode != 0


def test_a_master_with_the_certificate_job_submit_issues_trusts_only_the_published_ca(
        tmp_path, start_master):
    """What `job submit` does on Kubernetes (paddlecloud.backends.k8s.jobs.create_job): a certificate
    for the master Service's names from a one-job CA; a real master serves it. A client that
    trusts the CA published on the Deployment gets in; one trusting another job's CA, or
    speaking plaintext, is refused."""
    from paddlecloud.auth import JobTokens
    from paddlecloud.backends.k8s import manifests
    from paddlecloud.jobspec import JobSpec
    from paddlecloud.tls import issue_master_certificate

    hosts = manifests.master_certificate_hosts("sec", "ml")
    certificate = issue_master_certificate(hosts, job="sec")
    deployment = manifests.publish_master_ca(
        manifests.master_deployment(JobSpec(name="sec", namespace="ml", module="m")), certificate.ca)
    published = deployment["metadata"]["annotations"][manifests.MASTER_CA_ANNOTATION].encode()
    (tmp_path / "tls.crt").write_bytes(certificate.cert)
    (tmp_path / "tls.key").write_bytes(certificate.key)
    tokens = JobTokens.generate().write(tmp_path / "tokens")
    write_records(tmp_path / "data", files=1, records_per_file=2)
    proc = start_master("--input", str(tmp_path / "data"), "--tokens-dir", str(tokens),
                        "--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key"))
    service_name = hosts[2]  # what clients dial: NAME-master.NS.svc
    viewer = (("authorization", f"Bearer {(tokens / 'viewer').read_text().strip()}"),)
    override = [("grpc.ssl_target_name_override", service_name)]
    trusted = grpc.ssl_channel_credentials(root_certificates=published)

    def serves_over_tls() -> bool:
        with grpc.secure_channel(proc.address, trusted, options=override) as channel:
            return _code(channel, viewer) == grpc.StatusCode.OK
    wait_until(serves_over_tls, timeout=60, details=proc.log)
    with grpc.secure_channel(proc.address, trusted, options=override) as channel:
        assert _code(channel, viewer) == grpc.StatusCode.OK
    other = issue_master_certificate(hosts, job="sec")  # same names, another job's CA
    with grpc.secure_channel(proc.address, grpc.ssl_channel_credentials(root_certificates=other.ca),
                             options=override) as channel:
        assert _code(channel, viewer) == grpc.StatusCode.UNAVAILABLE  # the handshake fails
    with grpc.insecure_channel(proc.address) as plaintext:
        assert _code(plaintext, viewer) == grpc.StatusCode.UNAVAILABLE
    # the certificate is for the Service's names only: dialled by another name it is refused
    with grpc.secure_channel(proc.address, trusted,
                             options=[("grpc.ssl_target_name_override", "other-master.ml.svc")]) as channel:
        assert _code(channel, viewer) == grpc.StatusCode.UNAVAILABLE
