"""The job's tokens on Kubernetes: the Secret, who mounts which token, who gets etcd's password."""

from __future__ import annotations

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
    assert secret["stringData"] == {"trainer": tokens.trainer, "operator": tokens.operator,
                                    "viewer": tokens.viewer}
    master = manifests.master_deployment(spec)
    kubernetes_validate.validate(master, kubernetes_validate.latest_version(), strict=True)
    command = master["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--tokens-dir") + 1] == "/var/run/paddlecloud/tokens"
