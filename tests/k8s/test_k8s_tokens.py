"""The job's tokens on Kubernetes: the Secret, who mounts which token, who gets etcd's password."""

from __future__ import annotations

import base64

import kubernetes_validate

from paddlecloud.auth import JobTokens
from paddlecloud.jobspec import JobSpec
from paddlecloud.k8s import manifests


def _container_env(pod: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["containers"][0]["env"]}


def test_trainers_and_pservers_mount_only_the_trainer_token_and_trainers_get_no_etcd_secret():
    spec = JobSpec(name="sec", namespace="ml", module="m", trainers=2, pservers=1)
    trainer = manifests.trainer_job(spec, None)["spec"]["template"]["spec"]
    pserver = manifests.pserver_statefulset(spec, None)["spec"]["template"]["spec"]
    for pod in (trainer, pserver):
        volume = next(v for v in pod["volumes"] if v["name"] == "job-tokens")
        assert volume["secret"] == {"secretName": "sec-tokens", "defaultMode": 0o400,
                                    "items": [{"key": "trainer", "path": "trainer"}]}
        assert _container_env(pod)["PADDLE_JOB_TOKEN_FILE"] == "/var/run/paddlecloud/tokens/trainer"
    assert not {"PADDLE_ETCD_USER", "PADDLE_ETCD_PASSWORD"} & set(_container_env(trainer))
    assert _container_env(pserver)["PADDLE_ETCD_USER"]["secretKeyRef"]["optional"] is True


def test_tokens_secret_is_valid_and_holds_the_three_roles():
    spec = JobSpec(name="sec", namespace="ml", module="m")
    tokens = JobTokens.generate()
    secret = manifests.tokens_secret(spec, tokens.as_mapping(), manifests.owner_reference("sec", "uid-1"))
    kubernetes_validate.validate(secret, kubernetes_validate.latest_version(), strict=True)
    decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert decoded == {"trainer": tokens.trainer, "operator": tokens.operator, "viewer": tokens.viewer}
    master = manifests.master_deployment(spec)
    kubernetes_validate.validate(master, kubernetes_validate.latest_version(), strict=True)
    command = master["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--tokens-dir") + 1] == "/var/run/paddlecloud/tokens"


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
    tokens = JobTokens(**{k: base64.b64decode(v).decode() for k, v in data.items()})
    server = grpc.aio.server(interceptors=[Authorization(TokenRoles(tokens, job="ctr"))])
    pb_grpc.add_MasterServicer_to_server(FakeMaster(), server)
    port = server.add_insecure_port("127.0.0.1:0")
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
