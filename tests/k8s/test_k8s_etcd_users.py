"""`job submit` and `job delete` with etcd's admin credentials: the job gets an etcd user of
its own (a real etcd with TLS and auth), in a Secret owned by its master Deployment, which
the master and the pservers mount and nothing else; `job delete` removes the user.
"""

from __future__ import annotations

import asyncio
import base64

import aetcd
import pytest
from click.testing import CliRunner, Result
from test_etcd_secured import secured  # noqa: F401 (a fixture)

from paddlecloud.backends.k8s import manifests
from paddlecloud.cli.jobs import job
from paddlecloud.etcd import EtcdAuthError, EtcdCredentials, connect
from paddlecloud.keys import JobKeys


async def run(*args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, job, list(args), catch_exceptions=False)


def _stored_user(k8s, name: str) -> tuple[str, str]:
    data = k8s.stored("secrets", "ml", manifests.etcd_user_secret_name(name))["data"]
    return base64.b64decode(data["user"]).decode(), base64.b64decode(data["password"]).decode()


async def test_submit_makes_the_jobs_etcd_user_and_delete_removes_it(k8s, kubeconfig, secured,  # noqa: F811
                                                                      monkeypatch):
    etcd, env = secured
    for key, value in env.items():  # the submitter holds etcd's root credentials
        monkeypatch.setenv(key, value)
    submitted = await run("submit", "ctr", "--module", "ctr.train", "--pservers", "1", "--namespace", "ml",
                          "--etcd-endpoints", etcd.endpoint, "--kubeconfig", kubeconfig)
    assert submitted.exit_code == 0, submitted.output
    secret = k8s.stored("secrets", "ml", "ctr-etcd")
    owner = manifests.owner_reference("ctr", k8s.stored("deployments", "ml", "ctr-master")["metadata"]["uid"])
    assert secret["metadata"]["ownerReferences"] == [owner]
    user, password = _stored_user(k8s, "ctr")
    assert user == "paddlecloud.ml.ctr" and password not in submitted.output
    job_user = EtcdCredentials(ca_file=env["PADDLE_ETCD_CA_FILE"], cert_file=env["PADDLE_ETCD_CERT_FILE"],
                               key_file=env["PADDLE_ETCD_KEY_FILE"], user=user, password=password)
    mine, neighbour = JobKeys("ml", "ctr"), JobKeys("ml", "other")
    client = await connect(etcd.endpoint, credentials=job_user, probe=mine.prefix)
    try:
        await client.put(mine.phase, b"Running")
        with pytest.raises(aetcd.ClientError, match="permission denied"):
            await client.get(neighbour.phase)
    finally:
        await client.close()

    deleted = await run("delete", "ctr", "-n", "ml", "--kubeconfig", kubeconfig)
    assert deleted.exit_code == 0, deleted.output
    assert "etcd: cleared /paddlecloud/ml/ctr/ (1 keys)" in deleted.output
    with pytest.raises(EtcdAuthError):  # the job's user is gone with it
        await connect(etcd.endpoint, credentials=job_user, probe=mine.prefix, timeout=5)


async def test_submit_refuses_when_etcd_refuses_and_leaves_nothing(k8s, kubeconfig, secured,  # noqa: F811
                                                                   monkeypatch, tmp_path):
    etcd, env = secured
    (tmp_path / "wrong").write_text("not the root password")
    for key, value in {**env, "PADDLE_ETCD_PASSWORD_FILE": str(tmp_path / "wrong")}.items():
        monkeypatch.setenv(key, value)
    result = await run("submit", "ctr", "--module", "ctr.train", "--namespace", "ml",
                       "--etcd-endpoints", etcd.endpoint, "--kubeconfig", kubeconfig)
    assert result.exit_code != 0
    assert "could not make the etcd user of job ctr" in result.output
    assert "not the root password" not in result.output
    for resource, name in k8s.posted():  # made before etcd was asked (the name claimed), undone
        assert k8s.stored(resource, "ml", name) is None, (resource, name)
    assert ("secrets", "ctr-etcd") not in k8s.posted()


async def test_submitting_a_name_in_use_leaves_the_running_jobs_etcd_user_alone(
        k8s, kubeconfig, secured, monkeypatch):  # noqa: F811
    etcd, env = secured
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    args = ("submit", "twice", "--module", "m", "--namespace", "ml", "--etcd-endpoints", etcd.endpoint,
            "--kubeconfig", kubeconfig)
    assert (await run(*args)).exit_code == 0
    user, password = _stored_user(k8s, "twice")
    again = await run(*args)
    assert again.exit_code != 0 and "job twice already exists in namespace ml" in again.output
    job_user = EtcdCredentials(ca_file=env["PADDLE_ETCD_CA_FILE"], cert_file=env["PADDLE_ETCD_CERT_FILE"],
                               key_file=env["PADDLE_ETCD_KEY_FILE"], user=user, password=password)
    client = await connect(etcd.endpoint, credentials=job_user, probe=JobKeys("ml", "twice").prefix)
    await client.close()  # the first job's password still logs in
    assert k8s.stored("deployments", "ml", "twice-master") is not None
    assert (await run("delete", "twice", "-n", "ml", "--kubeconfig", kubeconfig)).exit_code == 0


async def test_submit_without_etcd_credentials_makes_no_user(k8s, kubeconfig, monkeypatch):
    for key in ("PADDLE_ETCD_USER", "PADDLE_ETCD_PASSWORD", "PADDLE_ETCD_PASSWORD_FILE"):
        monkeypatch.delenv(key, raising=False)
    result = await run("submit", "ctr", "--module", "ctr.train", "--namespace", "ml",
                       "--kubeconfig", kubeconfig)
    assert result.exit_code == 0, result.output
    assert ("secrets", "ctr-etcd") not in k8s.posted()
    master = k8s.stored("deployments", "ml", "ctr-master")["spec"]["template"]["spec"]
    volume = next(v for v in master["volumes"] if v["name"] == "etcd-user")
    assert volume["secret"]["optional"] is True  # the master starts without it (etcd without auth)


async def test_the_operator_makes_the_jobs_etcd_user_once_and_removes_it_with_the_job(
        k8s_crds, api_client, kubeconfig, secured, monkeypatch):  # noqa: F811
    from kubernetes import client as k8s_client
    from test_operator import (
        GROUP,
        NS,
        PLURAL,
        VERSION,
        apply,
        assert_operator_rights,
        paddlejob,
        running_operator,
        wait_for_job,
    )

    from paddlecloud.backends.k8s.deployer import KubernetesDeployer
    from paddlecloud.paddlejob import translate
    from pdj_operator.handlers import ETCD_USER_ANNOTATION, OperatorConfig

    api = k8s_client.CustomObjectsApi(api_client)
    etcd, env = secured
    for key, value in env.items():  # the operator's etcd admin credentials (deploy/operator.yaml)
        monkeypatch.setenv(key, value)
    k8s = k8s_crds
    config = OperatorConfig(kubeconfig=kubeconfig, interval=0.2, etcd_endpoints=etcd.endpoint)
    async with running_operator(config):
        await apply(api, paddlejob(name="pdj"))
        await wait_for_job(k8s, "pdj")
        pdj = k8s.stored("paddlejobs", NS, "pdj")
        secret = k8s.stored("secrets", NS, "pdj-etcd")
        assert [r["uid"] for r in secret["metadata"]["ownerReferences"]] == [pdj["metadata"]["uid"]]
        assert pdj["metadata"]["annotations"][ETCD_USER_ANNOTATION] == "paddlecloud.ml.pdj"
        # recorded after the CA, by the same field manager: the CA stays recorded
        assert pdj["metadata"]["annotations"][manifests.MASTER_CA_ANNOTATION].startswith("-----BEGIN")
        user, password = _stored_user(k8s, "pdj")
        job_user = EtcdCredentials(ca_file=env["PADDLE_ETCD_CA_FILE"], cert_file=env["PADDLE_ETCD_CERT_FILE"],
                                   key_file=env["PADDLE_ETCD_KEY_FILE"], user=user, password=password)
        client = await connect(etcd.endpoint, credentials=job_user, probe=JobKeys(NS, "pdj").prefix)
        await client.close()
        # the master's pods mount it; a re-created master finds the same Secret, made once
        master = k8s.stored("deployments", NS, "pdj-master")["spec"]["template"]["spec"]
        assert {"name": "etcd-user", "secret": {"secretName": "pdj-etcd", "optional": True,
                                                "defaultMode": 0o440}} in master["volumes"]
        assert [n for r, n in k8s.posted() if r == "secrets"].count("pdj-etcd") == 1
        # the master's workloads (the operator's delete lists them)
        spec = translate(pdj, etcd_endpoints=etcd.endpoint, image=config.image).validate()
        deployer = KubernetesDeployer(spec, api_client=api_client)
        await deployer.create_pservers()
        await deployer.create_trainers()
        await asyncio.to_thread(api.delete_namespaced_custom_object, GROUP, VERSION, NS, PLURAL, "pdj")
        await k8s.wait_for(lambda: k8s.stored("paddlejobs", NS, "pdj") is None, what="the PaddleJob gone")
    with pytest.raises(EtcdAuthError):
        await connect(etcd.endpoint, credentials=job_user, probe=JobKeys(NS, "pdj").prefix, timeout=5)
    assert_operator_rights(k8s)
