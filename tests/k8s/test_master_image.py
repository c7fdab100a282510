"""The master runs paddlecloud's image, never the submitter's (issue 34, finding 2): pinned by the
Job Server's configuration, by the operator's, and by `job submit --paddlecloud-image` (default:
paddlecloud's image); a submitter's base image runs only in the roles' pods."""

from __future__ import annotations

from typing import Any

import yaml
from click.testing import CliRunner
from test_job_server import JOB, A, k8s_resource, server, upload

from paddlecloud.backends.k8s import manifests
from paddlecloud.cli.jobs import job
from paddlecloud.jobspec import DEFAULT_IMAGE, JobSpec
from paddlecloud.paddlejob import translate
from pdj_operator.handlers import OperatorConfig, spec_of

EVIL = "evil/img:1"
PINNED = "registry.example.com/paddlecloud:7"


def containers(deployment: dict[str, Any]) -> list[str]:
    pod = deployment["spec"]["template"]["spec"]
    return [c["image"] for c in pod.get("initContainers", []) + pod["containers"]]


def rendered(spec: JobSpec, kind: str, name: str) -> dict[str, Any]:
    objects = manifests.submit_objects(spec, None) + manifests.master_objects(spec, None)
    return next(o for o in objects if (o["kind"], o["metadata"]["name"]) == (kind, name))


async def test_a_job_server_submission_runs_the_servers_paddlecloud_image_whatever_its_base_image(
        k8s, api_client, tmp_path):
    async with server(api_client, tmp_path, paddlecloud_image=PINNED) as client:
        digest = await upload(client)
        response = await client.post("/v1/trainer/job", headers=A, json={
            **JOB, "trainer_package": digest, "base_image": EVIL})
    assert response.status_code == 201, response.text
    assert containers(k8s.stored("deployments", "team-a", "fit-master")) == [PINNED]
    # the submitter's image still runs the job's own pods, which the master renders
    spec = JobSpec.from_yaml(k8s.stored("configmaps", "team-a", "fit-spec")["data"]["job.yaml"])
    assert (spec.image, spec.paddlecloud_image) == (EVIL, PINNED)
    roles = [o for o in manifests.master_objects(spec, None) if o["kind"] in ("StatefulSet", "Job")]
    assert {o["kind"] for o in roles} >= {"Job"}
    # the programs run the submitter's image; paddlecloud's containers beside them the pinned one
    programs = {c["image"] for o in roles for c in o["spec"]["template"]["spec"]["containers"]}
    helpers = {c["image"] for o in roles for c in o["spec"]["template"]["spec"].get("initContainers", [])}
    assert programs == {EVIL} and helpers == {PINNED}


async def test_by_default_the_job_server_pins_paddlecloud_s_image(k8s, api_client, tmp_path):
    async with server(api_client, tmp_path) as client:
        response = await client.post("/v1/trainer/job", headers=A, json={**JOB, "base_image": EVIL})
    assert response.status_code == 201, response.text
    assert containers(k8s.stored("deployments", "team-a", "fit-master")) == [DEFAULT_IMAGE]


async def test_a_paddlejob_from_the_job_server_gets_the_operators_image_for_its_master(
        k8s_crds, api_client, tmp_path):
    async with server(api_client, tmp_path, paddlejobs=True) as client:
        response = await client.post("/v1/trainer/job", headers=A, json={**JOB, "base_image": EVIL})
    assert response.status_code == 201, response.text
    stored = k8s_crds.kmock.objects[k8s_resource("paddlejobs"), "team-a", "fit"].raw
    spec = spec_of(stored, OperatorConfig(image=PINNED))
    assert containers(rendered(spec, "Deployment", "fit-master")) == [PINNED]
    assert spec.worker_template["spec"]["containers"][0]["image"] == EVIL


def test_the_operator_pins_the_paddlecloud_image_whatever_the_paddlejobs_containers_run():
    def role(replicas: int) -> dict[str, Any]:
        return {"replicas": replicas, "template": {"spec": {"containers": [
            {"name": "paddle", "image": EVIL, "command": ["python", "-m", "ctr.train"]}]}}}

    body = {"apiVersion": "batch.paddlepaddle.org/v1", "kind": "PaddleJob",
            "metadata": {"name": "ctr", "namespace": "team-a"},
            "spec": {"ps": role(1), "worker": role(2)}}
    spec = spec_of(body, OperatorConfig(image=PINNED))
    assert containers(rendered(spec, "Deployment", "ctr-master")) == [PINNED]
    # without the operator's settings (job submit -f), the master is paddlecloud's, not EVIL
    assert containers(rendered(translate(body).validate(), "Deployment", "ctr-master")) == [DEFAULT_IMAGE]


def master_of(output: str, name: str) -> dict[str, Any]:
    return next(d for d in yaml.safe_load_all(output)
                if d and (d["kind"], d["metadata"]["name"]) == ("Deployment", f"{name}-master"))


def test_job_submit_runs_paddlecloud_s_image_as_the_master_unless_told_another():
    def submit(*args: str) -> Any:
        return CliRunner().invoke(job, ["submit", "fit", "--module", "fit.train", "--image", EVIL,
                                        *args], catch_exceptions=False)

    default = submit("--dry-run")
    assert default.exit_code == 0, default.output
    assert containers(master_of(default.output, "fit")) == [DEFAULT_IMAGE]
    named = submit("--dry-run", "--paddlecloud-image", PINNED)
    assert containers(master_of(named.output, "fit")) == [PINNED]
    bad = submit("--dry-run", "--paddlecloud-image", "two words")
    assert bad.exit_code != 0 and "invalid paddlecloud image 'two words'" in bad.output
    # the Job Server chooses its masters' image: --server cannot carry another
    served = submit("--paddlecloud-image", PINNED, "--server", "http://127.0.0.1:9", "--token", "t")
    assert served.exit_code != 0 and "cannot carry paddlecloud_image" in served.output
