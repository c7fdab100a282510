"""The job's tokens and master certificate on Kubernetes: the Secret, who mounts which token and
which TLS file, who gets etcd's password, where the CA is published."""

from __future__ import annotations

import base64

import kubernetes_validate
import pytest

from paddlecloud.auth import JobTokens
from paddlecloud.backends.k8s import manifests
from paddlecloud.jobspec import JobSpec
from paddlecloud.tls import issue_master_certificate


def _container_env(pod: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["containers"][0]["env"]}


@pytest.mark.unit
def test_trainers_and_pservers_mount_only_the_trainer_token_and_trainers_get_no_etcd_secret():
    spec = JobSpec(name="sec", namespace="ml", module="m", trainers=2, pservers=1)
    trainer = manifests.trainer_job(spec, None)["spec"]["template"]["spec"]
    pserver = manifests.pserver_statefulset(spec, None)["spec"]["template"]["spec"]
    for pod in (trainer, pserver):
        volume = next(v for v in pod["volumes"] if v["name"] == "job-tokens")
        # the trainer token and the (public) CA; never the master's key or the other tokens;
        # readable by the image's user and by paddlecloud's wait-master (no fsGroup joins them)
        assert volume["secret"] == {"secretName": "sec-tokens", "defaultMode": 0o444,
                                    "items": [{"key": "trainer", "path": "trainer"},
                                              {"key": "ca.crt", "path": "ca.crt"}]}
        assert _container_env(pod)["PADDLE_JOB_TOKEN_FILE"] == "/var/run/paddlecloud/tokens/trainer"
        assert _container_env(pod)["PADDLE_MASTER_CA_FILE"] == "/var/run/paddlecloud/tokens/ca.crt"
    etcd = {"PADDLE_ETCD_USER", "PADDLE_ETCD_PASSWORD", "PADDLE_ETCD_PASSWORD_FILE"}
    assert not etcd & set(_container_env(trainer))
    assert not etcd & set(_container_env(pserver))  # the program's container: none of them
    agent = next(c for c in pserver["initContainers"] if c["name"] == "paddlecloud-agent")
    user = next(e for e in agent["env"] if e["name"] == "PADDLE_ETCD_USER")  # its sidecar's
    assert user["valueFrom"]["secretKeyRef"]["optional"] is True


@pytest.mark.unit
def test_tokens_secret_is_valid_and_holds_the_three_roles_and_the_masters_tls_files():
    spec = JobSpec(name="sec", namespace="ml", module="m")
    tokens = JobTokens.generate()
    certificate = issue_master_certificate(manifests.master_certificate_hosts("sec", "ml"), job="sec")
    secret = manifests.tokens_secret(spec, tokens.as_mapping(), manifests.owner_reference("sec", "uid-1"),
                                     certificate=certificate)
    kubernetes_validate.validate(secret, kubernetes_validate.latest_version(), strict=True)
    decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert decoded == {"trainer": tokens.trainer, "operator": tokens.operator, "viewer": tokens.viewer,
                       "tls.crt": certificate.cert.decode(), "tls.key": certificate.key.decode(),
                       "ca.crt": certificate.ca.decode()}
    master = manifests.master_deployment(spec)
    kubernetes_validate.validate(master, kubernetes_validate.latest_version(), strict=True)
    container = master["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]
    assert command[command.index("--tokens-dir") + 1] == "/var/run/paddlecloud/tokens"
    assert command[command.index("--tls-cert") + 1] == "/var/run/paddlecloud/tokens/tls.crt"
    assert command[command.index("--tls-key") + 1] == "/var/run/paddlecloud/tokens/tls.key"
    # the kubelet's gRPC probe speaks no TLS: readiness is the HTTP port's /ready (no token)
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "metrics"}
    assert {"name": "metrics", "containerPort": manifests.METRICS_PORT} in container["ports"]


@pytest.mark.unit
def test_the_certificate_names_the_master_service_and_its_ca_signs_nothing_else():
    from cryptography import x509

    certificate = issue_master_certificate(manifests.master_certificate_hosts("sec", "ml"), job="sec")
    leaf = x509.load_pem_x509_certificates(certificate.cert)[0]
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [
        "sec-master", "sec-master.ml", "sec-master.ml.svc", "sec-master.ml.svc.cluster.local",
        "localhost"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]  # port-forward
    ca = x509.load_pem_x509_certificate(certificate.ca)
    leaf.verify_directly_issued_by(ca)
    assert b"PRIVATE KEY" not in certificate.ca + certificate.cert  # the CA's key is nowhere
    assert "sec" in ca.subject.rfc4514_string()


async def test_submit_stores_the_masters_key_only_in_the_secret_and_publishes_the_ca(k8s, kubeconfig):
    from test_k8s_cli import run, submit_args

    assert (await run(*submit_args("ctr", kubeconfig))).exit_code == 0
    secret = k8s.stored("secrets", "ml", "ctr-tokens")["data"]
    key = base64.b64decode(secret["tls.key"])
    ca = base64.b64decode(secret["ca.crt"])
    assert b"PRIVATE KEY" in key
    deployment = k8s.stored("deployments", "ml", "ctr-master")
    assert deployment["metadata"]["annotations"][manifests.MASTER_CA_ANNOTATION].encode() == ca
    # the key is in no other object the submit made (the CA's key in none at all)
    for (resource, name) in k8s.posted():
        if resource != "secrets":
            stored = str(k8s.stored(resource, "ml", name))
            assert secret["tls.key"] not in stored and key.decode() not in stored, (resource, name)
    assert not any("PRIVATE KEY" in str(k8s.stored(r, "ml", n)) for r, n in k8s.posted() if r != "secrets")


async def test_job_status_reads_the_viewer_token_from_the_jobs_secret(k8s, kubeconfig, monkeypatch):
    """`job status` without PADDLE_JOB_TOKEN_FILE takes the viewer token of the Secret submit
    made; the master (behind the real authorization interceptor) accepts it."""
    import grpc
    from test_k8s_cli import FakeMaster, run, submit_args

    from master.authorization import Authorization
    from paddlecloud.api import pb_grpc
    from paddlecloud.auth import TokenRoles

    monkeypatch.delenv("PADDLE_JOB_TOKEN_FILE", raising=False)
    assert (await run(*submit_args("ctr", kubeconfig))).exit_code == 0
    data = k8s.stored("secrets", "ml", "ctr-tokens")["data"]
    tokens = JobTokens(**{k: base64.b64decode(data[k]).decode() for k in ("trainer", "operator", "viewer")})
    server = grpc.aio.server(interceptors=[Authorization(TokenRoles(tokens, job="ctr"))])
    pb_grpc.add_MasterServicer_to_server(FakeMaster(), server)
    # it serves the certificate submit issued; `status` trusts the CA the Deployment publishes
    served = grpc.ssl_server_credentials([(base64.b64decode(data["tls.key"]),
                                           base64.b64decode(data["tls.crt"]))])
    port = server.add_secure_port("127.0.0.1:0", served)
    await server.start()
    try:
        result = await run("status", "ctr", "-n", "ml", "--kubeconfig", kubeconfig, "--master",
                           f"127.0.0.1:{port}")
        assert result.exit_code == 0, result.output
        assert "leader 10.0.0.7:8080" in result.output
        monkeypatch.setenv("PADDLE_JOB_TOKEN_FILE", str(k8s_tokenless_file(kubeconfig)))
        refused = await run("status", "ctr", "-n", "ml", "--kubeconfig", kubeconfig, "--master",
                            f"127.0.0.1:{port}")
        assert "refused our token" in refused.output and "UNAUTHENTICATED" in refused.output
    finally:
        await server.stop(None)


def k8s_tokenless_file(kubeconfig: str):
    """A token file holding no token of the job."""
    from pathlib import Path

    path = Path(kubeconfig).parent / "not-a-token"
    path.write_text("not-a-token\n")
    return path
