"""The Job Server against kmock: submit as `job submit` does, tokens, quotas, image builds, OpenAPI."""

from __future__ import annotations

import asyncio
import io
import zipfile
from typing import Any

import httpx2
import kubernetes_validate
import pytest

from job_server.app import create_app
from job_server.config import Quotas, ServerConfig
from paddlecloud.backends.k8s import image_build, manifests
from paddlecloud.jobrequest import TrainerJob
from paddlecloud.jobspec import JobSpec

TOKENS = {"token-a": ("team-a",), "token-b": ("team-b",)}
A = {"Authorization": "Bearer token-a"}
B = {"Authorization": "Bearer token-b"}
PACKAGE = {"requirements.txt": b"", "fit/__init__.py": b"", "fit/train.py": b"print('fit')\n"}


def zipped(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return out.getvalue()


def server(api_client: Any, tmp_path: Any, **config: Any) -> httpx2.AsyncClient:
    app = create_app(ServerConfig(store=str(tmp_path / "store"), tokens=TOKENS, **config),
                     api_client=api_client)
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://server")


async def upload(client: httpx2.AsyncClient) -> str:
    response = await client.post("/v1/package", headers=A,
                                 files={"file": ("fit.zip", zipped(PACKAGE))})
    assert response.status_code == 201, response.text
    return response.json()["digest"]


JOB = {"job_name": "fit", "module": "fit.train", "trainers": 2, "pservers": 1, "memory": "1Gi",
       "cpu_num": 2, "input": ["/data/*.csv"], "epochs": 2, "env": {"GLOG_v": "1"}}


async def test_submit_creates_exactly_what_job_submit_creates(k8s, api_client, tmp_path):
    async with server(api_client, tmp_path) as client:
        digest = await upload(client)
        response = await client.post("/v1/trainer/job", headers=A,
                                     json={**JOB, "trainer_package": digest})
        assert response.status_code == 201, response.text
    assert response.json() == {"name": "fit", "namespace": "team-a",
                               "image": "paddlecloud/paddlecloud:0.1.0"}
    assert k8s.posted() == [("configmaps", "fit-spec"), ("configmaps", "fit-package"),
                            ("deployments", "fit-master"), ("services", "fit-master"),
                            ("serviceaccounts", "fit-master"), ("roles", "fit-master"),
                            ("rolebindings", "fit-master"), ("secrets", "fit-tokens"),
                            ("networkpolicies", "fit-internal"), ("networkpolicies", "fit-master"),
                            ("networkpolicies", "fit-job-egress"), ("networkpolicies", "fit-master-egress"),
                            ("networkpolicies", "fit-ps-egress")]
    spec = TrainerJob(**{**JOB, "input": tuple(JOB["input"])}, namespace="team-a").to_spec(
        package_path=f"package:{digest[:12]}", package_files=tuple(sorted(PACKAGE)))
    expected = {(o["kind"], o["metadata"]["name"]): o for o in manifests.submit_objects(spec, PACKAGE)}
    deployment = k8s.stored("deployments", "team-a", "fit-master")
    assert deployment["spec"] == expected["Deployment", "fit-master"]["spec"]
    assert k8s.stored("configmaps", "team-a", "fit-spec")["data"] == expected["ConfigMap", "fit-spec"]["data"]
    assert k8s.stored("configmaps", "team-a", "fit-package")["data"] == expected["ConfigMap", "fit-package"]["data"]
    owner = manifests.owner_reference("fit", deployment["metadata"]["uid"])
    assert k8s.stored("services", "team-a", "fit-master")["metadata"]["ownerReferences"] == [owner]
    assert k8s.stored("roles", "team-a", "fit-master")["rules"] == expected["Role", "fit-master"]["rules"]


async def test_a_token_sees_reads_and_deletes_nothing_of_another_namespace(
        k8s, api_client, tmp_path, etcd_endpoint):
    async with server(api_client, tmp_path, etcd_endpoints=(etcd_endpoint,)) as client:
        assert (await client.post("/v1/trainer/job", headers=A, json=JOB)).status_code == 201
        listed_a = (await client.get("/v1/jobs", headers=A)).json()
        assert [j["name"] for j in listed_a["items"]] == ["fit"]
        assert (await client.get("/v1/jobs", headers=B)).json()["items"] == []
        for method, path in (("GET", "/v1/jobs?namespace=team-a"),
                             ("GET", "/v1/jobs/fit?namespace=team-a"),
                             ("DELETE", "/v1/jobs/fit?namespace=team-a")):
            refused = await client.request(method, path, headers=B)
            assert refused.status_code == 403 and "team-a" in refused.json()["detail"]
        assert (await client.get("/v1/jobs/fit", headers=B)).status_code == 404
        assert (await client.delete("/v1/jobs/fit", headers=B)).status_code == 404
        assert k8s.stored("deployments", "team-a", "fit-master") is not None
        status = await client.get("/v1/jobs/fit", headers=A)
        assert status.status_code == 200, status.text
        assert status.json()["phase"] == "Pending" and status.json()["progress"] is None
        deleted = await client.delete("/v1/jobs/fit", headers=A)
        assert deleted.status_code == 200, deleted.text
        assert "deployments/fit-master" in deleted.json()["deleted"]
    assert k8s.stored("deployments", "team-a", "fit-master") is None


async def test_the_job_list_is_paginated(k8s, api_client, tmp_path):
    async with server(api_client, tmp_path) as client:
        for name in ("a1", "a2", "a3"):
            assert (await client.post("/v1/trainer/job", headers=A,
                                      json={**JOB, "job_name": name})).status_code == 201
        first = (await client.get("/v1/jobs?limit=2", headers=A)).json()
        assert [j["name"] for j in first["items"]] == ["a1", "a2"] and first["next_after"] == "a2"
        rest = (await client.get(f"/v1/jobs?limit=2&after={first['next_after']}", headers=A)).json()
        assert [j["name"] for j in rest["items"]] == ["a3"] and rest["next_after"] is None


@pytest.mark.parametrize(("job", "limit"), [
    ({"trainers": 5}, "max_trainers_per_job is 4"),
    ({"trainers": 2, "max_trainers": 6}, "max_trainers_per_job is 4"),
    ({"trainers": 3, "use_gpu": True, "gpu_num": 2}, "max_gpus_per_job is 4"),
])
async def test_a_quota_exceeded_is_refused_naming_the_limit_before_anything_is_created(
        k8s, api_client, tmp_path, job, limit):
    quotas = Quotas(max_gpus_per_job=4, max_trainers_per_job=4)
    async with server(api_client, tmp_path, quotas=quotas) as client:
        response = await client.post("/v1/trainer/job", headers=A, json={**JOB, **job})
    assert response.status_code == 403 and limit in response.json()["detail"]
    assert k8s.posted() == []


async def test_a_bad_value_is_a_422_naming_it(k8s, api_client, tmp_path):
    async with server(api_client, tmp_path) as client:
        response = await client.post("/v1/trainer/job", headers=A, json={**JOB, "memory": "lots"})
        unknown = await client.post("/v1/trainer/job", headers=A,
                                    json={**JOB, "trainer_package": "ab" * 32})
    assert response.status_code == 422 and "'lots'" in response.text
    assert unknown.status_code == 422 and "unknown trainer_package" in unknown.text
    assert k8s.posted() == []


# ---- image builds ------------------------------------------------------------------------------
def build_config(tmp_path: Any) -> image_build.BuildConfig:
    return image_build.BuildConfig(registry="registry.example.com/pc", namespace="builds",
                                   push_secret="registry-push", context_claim="packages",
                                   timeout_s=60, poll_s=0.02)


@pytest.mark.unit
def test_the_build_job_is_strictly_valid():
    config = build_config(None)
    job = image_build.build_job(config, tag="ab" * 16, context="contexts/x.tar.gz")
    for version in ("1.28", kubernetes_validate.latest_version()):
        kubernetes_validate.validate(job, version, strict=True)
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--context=tar:///context/contexts/x.tar.gz" in args
    assert f"--destination=registry.example.com/pc/runtime:{'ab' * 16}" in args


@pytest.mark.unit
def test_the_image_tag_is_the_hash_of_the_package_and_the_base_image():
    assert image_build.image_tag("p1", "base:1") == image_build.image_tag("p1", "base:1")
    assert image_build.image_tag("p1", "base:1") != image_build.image_tag("p1", "base:2")
    assert image_build.image_tag("p1", "base:1") != image_build.image_tag("p2", "base:1")


async def test_a_built_image_runs_the_jobs_pods(k8s, api_client, tmp_path):
    config = build_config(tmp_path)
    async with server(api_client, tmp_path, build=config) as client:
        digest = await upload(client)
        submit = asyncio.create_task(client.post(
            "/v1/trainer/job", headers=A, json={**JOB, "trainer_package": digest}))
        tag = image_build.image_tag(digest, JOB.get("base_image", "paddlecloud/paddlecloud:0.1.0"))
        name = image_build.build_job_name(tag)
        await k8s.wait_for(lambda: k8s.stored("jobs", "builds", name), what="the build Job")
        assert k8s.stored("deployments", "team-a", "fit-master") is None  # waits for the build
        k8s.set_job_status("builds", name, {"succeeded": 1})
        response = await submit
    assert response.status_code == 201, response.text
    image = f"registry.example.com/pc/runtime:{tag}"
    assert response.json()["image"] == image
    spec_cm = k8s.stored("configmaps", "team-a", "fit-spec")["data"]["job.yaml"]
    assert f"image: {image}" in spec_cm
    assert k8s.stored("configmaps", "team-a", "fit-package") is None  # the package is in the image
    import tarfile

    with tarfile.open(tmp_path / "store" / "contexts" / f"{tag}.tar.gz") as context:
        assert sorted(context.getnames()) == ["Dockerfile", *sorted(f"package/{p}" for p in PACKAGE)]
        dockerfile = context.extractfile("Dockerfile").read().decode()
    assert dockerfile.startswith("FROM paddlecloud/paddlecloud:0.1.0\n")
    assert "pip install --no-cache-dir -r /opt/paddlecloud/package/requirements.txt" in dockerfile


async def test_a_failed_build_fails_the_job_with_the_log_tail(k8s, api_client, tmp_path):
    config = build_config(tmp_path)
    async with server(api_client, tmp_path, build=config) as client:
        digest = await upload(client)
        submit = asyncio.create_task(client.post(
            "/v1/trainer/job", headers=A, json={**JOB, "trainer_package": digest}))
        name = image_build.build_job_name(image_build.image_tag(digest, "paddlecloud/paddlecloud:0.1.0"))
        await k8s.wait_for(lambda: k8s.stored("jobs", "builds", name), what="the build Job")
        pod = f"{name}-x7k2p"
        k8s.kmock.objects[k8s_resource("pods"), "builds", pod] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": "builds", "labels": {"job-name": name}},
            "spec": {"containers": [{"name": "kaniko", "image": "kaniko"}]}}
        k8s.kmock[f"get /api/v1/namespaces/builds/pods/{pod}/log"] << (
            b"Step 3/4 : RUN python -m pip install -r requirements.txt\n"
            b"ERROR: No matching distribution found for nosuchpkg\n")
        k8s.set_job_status("builds", name, {"failed": 1})
        response = await submit
    assert response.status_code == 422, response.text
    assert "No matching distribution found for nosuchpkg" in response.json()["detail"]
    assert ("deployments", "fit-master") not in k8s.posted()


def k8s_resource(plural: str) -> Any:
    from conftest import RESOURCES

    return RESOURCES[plural]


@pytest.mark.unit
def test_the_job_server_manifest_is_strictly_valid_and_namespace_scoped():
    from pathlib import Path

    import yaml

    path = Path(__file__).resolve().parents[2] / "deploy" / "components" / "job-server" / "job-server.yaml"
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        for version in ("1.28", kubernetes_validate.latest_version()):
            kubernetes_validate.validate(doc, version, strict=True)
    kinds = {d["kind"] for d in docs}
    assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds
    role = next(d for d in docs if d["kind"] == "Role")
    assert not any("*" in rule["verbs"] for rule in role["rules"])
    # Secrets: it creates each job's tokens (by apply: create and patch), and reads one by
    # name (a job's viewer token, for its proxied page); it lists and watches none
    assert [rule["verbs"] for rule in role["rules"] if "secrets" in rule["resources"]] == [["create", "patch", "get"]]


async def test_where_the_operator_runs_a_job_goes_in_as_a_paddlejob(k8s_crds, api_client, tmp_path):
    import jsonschema
    from test_paddlejob import crd_schema

    from paddlecloud.paddlejob import translate

    k8s = k8s_crds
    async with server(api_client, tmp_path, paddlejobs=True) as client:
        response = await client.post("/v1/trainer/job", headers=A, json={**JOB, "namespace": "team-a"})
        assert response.status_code == 201, response.text
        assert k8s.posted() == [("paddlejobs", "fit")]  # the operator makes the master
        stored = k8s.kmock.objects[k8s_resource("paddlejobs"), "team-a", "fit"].raw
        jsonschema.validate(stored, crd_schema())
        spec = translate(stored).validate()
        assert (spec.trainers, spec.pservers, spec.epochs, spec.inputs) == (2, 1, 2, ("/data/*.csv",))
        assert spec.worker_template["spec"]["containers"][0]["command"] == ["python3", "-m", "fit.train"]
        manifests.master_objects(spec, None)  # renders
        listed = (await client.get("/v1/jobs", headers=A)).json()["items"]
        assert [(j["name"], j["phase"]) for j in listed] == [("fit", "Pending")]
        assert (await client.get("/v1/jobs/fit", headers=A)).json()["phase"] == "Pending"
        deleted = await client.delete("/v1/jobs/fit", headers=A)
        assert deleted.json()["deleted"] == ["paddlejobs/fit"]
    assert k8s.kmock.objects[k8s_resource("paddlejobs"), "team-a", "fit"].deleted


async def test_a_jobs_progress_comes_from_its_master_over_tls_with_its_viewer_token(
        k8s, api_client, tmp_path, start_master, monkeypatch):
    """A real master serving the certificate issued at submit and the job's tokens: the Job
    Server trusts the CA on the Deployment and asks with the viewer token of the job's Secret
    (without either, the master refuses and the progress stays None)."""
    import base64

    from datasets import write_records
    from masters import wait_for

    async with server(api_client, tmp_path) as client:
        assert (await client.post("/v1/trainer/job", headers=A, json=JOB)).status_code == 201
        data = k8s.stored("secrets", "team-a", manifests.tokens_secret_name("fit"))["data"]
        tokens = tmp_path / "tokens"
        tokens.mkdir()
        for role in ("trainer", "operator", "viewer"):
            (tokens / role).write_bytes(base64.b64decode(data[role]))
        for key in ("tls.crt", "tls.key"):
            (tmp_path / key).write_bytes(base64.b64decode(data[key]))
        write_records(tmp_path / "data", files=4, records_per_file=5)
        master = start_master("--input", str(tmp_path / "data"), "--epochs", "2", "--tokens-dir", str(tokens),
                              "--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key"))
        monkeypatch.setattr(manifests, "master_address",
                            lambda name, namespace: master.address if (name, namespace) == ("fit", "team-a")
                            else "127.0.0.1:1")
        progress: dict[str, Any] = {}

        async def answered() -> bool:
            reply = await client.get("/v1/jobs/fit", headers=A)
            assert reply.status_code == 200, reply.text
            progress.update(reply.json()["progress"] or {})
            return bool(progress)

        await wait_for(answered, timeout=60, message="no progress from the job's master", details=master.log)
        assert progress == {"epoch": 0, "epochs": 2, "tasks_done": 0, "tasks": 4, "trainers_alive": 0}


async def test_a_job_gets_the_servers_etcd_endpoints_or_one_it_allows(k8s, api_client, tmp_path):
    allowed = ("https://etcd-a:2379", "https://etcd-b:2379,https://etcd-c:2379")
    async with server(api_client, tmp_path, etcd_endpoints=allowed) as client:
        plain = await client.post("/v1/trainer/job", headers=A, json=JOB)
        named = await client.post("/v1/trainer/job", headers=A, json={
            **JOB, "job_name": "other", "etcd_endpoints": allowed[1]})
        foreign = await client.post("/v1/trainer/job", headers=A, json={
            **JOB, "job_name": "third", "etcd_endpoints": "https://paddlecloud-etcd:2379"})
    assert (plain.status_code, named.status_code, foreign.status_code) == (201, 201, 403), foreign.text

    def etcd_of(name: str) -> str:
        text = k8s.stored("configmaps", "team-a", f"{name}-spec")["data"][manifests.SPEC_KEY]
        return JobSpec.from_yaml(text).etcd_endpoints

    assert (etcd_of("fit"), etcd_of("other")) == allowed
    assert k8s.stored("configmaps", "team-a", "third-spec") is None


# ---- seed 001's paths, and a delete that could not clear the job's etcd keys ---------------------
async def test_the_seeds_job_list_path_answers_the_list_directly(k8s, api_client, tmp_path):
    async with server(api_client, tmp_path) as client:
        assert (await client.post("/v1/trainer/job", headers=A, json=JOB)).status_code == 201
        listed = await client.get("/v1/jobs/", headers=A)  # seed 001: `GET /v1/jobs/`, no -L
    assert listed.status_code == 200, listed.text
    assert [j["name"] for j in listed.json()["items"]] == ["fit"]


async def test_a_delete_whose_etcd_does_not_answer_says_so_and_is_finished_by_a_retry(
        k8s, api_client, tmp_path, etcd_endpoint):
    from tcp_proxy import TcpProxy

    from paddlecloud.etcd import connect
    from paddlecloud.keys import JobKeys

    host, port = etcd_endpoint.removeprefix("http://").rsplit(":", 1)
    proxy = await TcpProxy(host, int(port)).start()  # the job's etcd, cut and back at will
    keys = JobKeys("team-a", "kept")
    etcd = await connect(etcd_endpoint)
    try:
        async with server(api_client, tmp_path,
                          etcd_endpoints=(f"http://127.0.0.1:{proxy.port}",)) as client:
            assert (await client.post("/v1/trainer/job", headers=A,
                                      json={**JOB, "job_name": "kept"})).status_code == 201
            await etcd.put(keys.phase, b"Running")  # what the job's master wrote
            await proxy.pause()
            refused = await client.delete("/v1/jobs/kept", headers=A)
            assert refused.status_code == 503, refused.text
            assert refused.headers["retry-after"].isdigit()
            detail = refused.json()["detail"]
            assert "etcd keys under /paddlecloud/team-a/kept/" in detail
            assert "deployments/kept-master" in detail and "delete the job again" in detail
            assert k8s.stored("deployments", "team-a", "kept-master") is None
            kept = k8s.stored("configmaps", "team-a", "kept-spec")  # the retry's way to the keys
            assert kept is not None and not kept["metadata"].get("ownerReferences")
            assert (await etcd.get(keys.phase)).value == b"Running"
            again = await client.post("/v1/trainer/job", headers=A, json={**JOB, "job_name": "kept"})
            assert again.status_code == 409, again.text  # not over the old keys
            await proxy.resume()
            retried = await client.delete("/v1/jobs/kept", headers=A)
            assert retried.status_code == 200, retried.text
            assert retried.json()["deleted"] == ["configmaps/kept-spec"]
            assert (await etcd.get(keys.phase)) is None
            assert k8s.stored("configmaps", "team-a", "kept-spec") is None
            assert (await client.delete("/v1/jobs/kept", headers=A)).status_code == 404
    finally:
        await etcd.close()
        await proxy.close()


# ---- seed 001's own fields ---------------------------------------------------------------------
SEED_PACKAGE = {"trainer.py": b"print('quick start')\n", "dataset.py": b"",
                "requirements.txt": b""}  # seed 001's quick_start project


async def test_the_seeds_own_fields_submit_a_job_whose_package_is_its_entry_point(k8s, api_client, tmp_path):
    async with server(api_client, tmp_path) as client:
        uploaded = await client.post("/v1/package", headers=A,
                                     files={"file": ("quick_start.zip", zipped(SEED_PACKAGE))})
        digest = uploaded.json()["digest"]
        # seed 001's table: job_name, trainer_package (the entry point), input (one directory),
        # output, pservers, base-image, memory, use_gpu, cpu_num, gpu_num; no module
        response = await client.post("/v1/trainer/job", headers=A, json={
            "job_name": "quickstart", "trainer_package": digest, "input": "/quickstart/input",
            "output": "/quickstart/output", "pservers": 4, "base-image": "paddlepaddle/paddle:0.10.rc2",
            "memory": "512M", "use_gpu": False, "cpu_num": 1, "gpu_num": 1})
        assert response.status_code == 201, response.text
        stored = JobSpec.from_yaml(k8s.stored("configmaps", "team-a", "quickstart-spec")["data"][manifests.SPEC_KEY])
        assert (stored.module, stored.inputs, stored.image) == (
            "trainer", ("/quickstart/input",), "paddlepaddle/paddle:0.10.rc2")
        missing = await client.post("/v1/trainer/job", headers=A, json={
            "job_name": "other", "trainer_package": digest, "module": "quick_start.train",
            "input": "/quickstart/input"})
    assert missing.status_code == 422
    assert "module 'quick_start.train' is not in trainer_package" in missing.json()["detail"]
