"""EDL's TrainingJob through `paddlecloud operator` (kubectl apply -f of seed 004's shape), on kmock.

The operator converts a TrainingJob into the PaddleJob that runs it (owned by the
TrainingJob); the PaddleJob handlers then create the master as for any PaddleJob. The
TrainingJob CRD in deploy/ is generated from its module and strictly valid, and the seed's
TrainingJob fits its schema as `kubectl apply`'s strict field validation reads it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from test_operator import NS, assert_operator_rights, events, running_operator
from test_paddlejob import strict

from paddlecloud.backends.k8s import manifests
from paddlecloud.backends.k8s.deployer import KubernetesDeployer
from paddlecloud.jobspec import JobSpec
from paddlecloud.trainingjob import to_paddlejob
from pdj_operator import trainingjobs
from pdj_operator.handlers import make_settings, spec_of

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "deploy" / "crd-trainingjob.yaml"
EXAMPLE = Path(__file__).parent / "edl" / "examplejob.yaml"
GROUP, VERSION, PLURAL = "paddlepaddle.org", "v1", "trainingjobs"




def trainingjob(name: str = "example", **trainer: Any) -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": name, "namespace": NS}
    doc["spec"]["trainer"].update(trainer)
    return doc


def quick_retries() -> Any:
    """The operator's settings, its API retries short: kmock answers a failed JSON-patch test
    with 500 where an API server answers 422 (on which Kopf goes on with the object's next
    event at once). A PaddleJob the operator creates while it watches is announced first
    without its resourceVersion (conftest, gap 7), so Kopf's first finalizer patch on it fails
    so, and would be retried for a minute."""
    settings = make_settings()
    settings.networking.error_backoffs = [0.05, 0.05]
    return settings


async def apply(api: Any, doc: dict[str, Any]) -> None:
    await asyncio.to_thread(api.create_namespaced_custom_object, GROUP, VERSION, NS, PLURAL, doc)


async def wait_for_master(k8s: Any, name: str) -> None:
    """Until the PaddleJob's handlers made its job: the Created event on the PaddleJob comes
    after the last of the master's objects (the TrainingJob gets a Created event of its own)."""
    await k8s.wait_for(lambda: any(e["involvedObject"]["name"] == name and e["involvedObject"]["kind"] == "PaddleJob"
                                   for e in events(k8s, "Created")),
                       what=f"the Created event of PaddleJob {name}")


def test_the_crd_is_strictly_valid_generated_and_takes_the_seed_s_trainingjob():
    doc = yaml.safe_load(CRD_FILE.read_text())
    for version in ("1.28", kubernetes_validate.latest_version()):
        kubernetes_validate.validate(doc, version, strict=True)
    assert CRD_FILE.read_text() == trainingjobs.render(), (
        "deploy/crd-trainingjob.yaml is stale: python -m pdj_operator.trainingjobs > deploy/crd-trainingjob.yaml")
    assert (doc["metadata"]["name"], doc["spec"]["names"]["shortNames"]) == ("trainingjobs.paddlepaddle.org", ["tj"])
    schema = strict(doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    jsonschema.validate(yaml.safe_load(EXAMPLE.read_text()), schema)
    typo = trainingjob()
    typo["spec"]["trainer"]["min_instance"] = 1
    with pytest.raises(jsonschema.ValidationError, match="min_instance"):
        jsonschema.validate(typo, schema)


async def test_apply_converts_the_trainingjob_into_its_paddlejob_which_gets_the_master(k8s_crds, api, config):
    k8s = k8s_crds
    async with running_operator(config, settings=quick_retries()):
        await apply(api, trainingjob())
        await wait_for_master(k8s, "example")
        await k8s.wait_for(lambda: (k8s.stored("trainingjobs", NS, "example").get("status") or {}).get("mode"),
                           what="the PaddleJob's status copied onto the TrainingJob")
    tj = k8s.stored("trainingjobs", NS, "example")
    pdj = k8s.stored("paddlejobs", NS, "example")
    assert pdj["spec"] == to_paddlejob(trainingjob())["spec"]
    owner = pdj["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "TrainingJob", "example", tj["metadata"]["uid"], True)
    stored = k8s.stored("configmaps", NS, manifests.spec_configmap_name("example"))
    spec = JobSpec.from_yaml(stored["data"][manifests.SPEC_KEY])
    assert (spec.trainers, spec.min_trainers, spec.max_trainers, spec.pservers, spec.epochs) == (2, 2, 6, 2, 10)
    assert tj["status"]["paddleJob"] == "example"
    assert (tj["status"]["mode"], tj["status"]["trainerRange"]) == ("PS", "2..6")
    created = [e for e in events(k8s, "Created") if e["involvedObject"]["kind"] == "TrainingJob"]
    assert created and created[0]["involvedObject"]["apiVersion"] == "paddlepaddle.org/v1"
    assert_operator_rights(k8s)


async def test_a_trainingjob_with_min_above_max_fails_with_its_reason_and_creates_nothing(
        k8s_crds, api, config):
    k8s = k8s_crds
    async with running_operator(config, settings=quick_retries()):
        await apply(api, trainingjob(name="bad", **{"min-instance": 8}))
        await k8s.wait_for(lambda: (k8s.stored("trainingjobs", NS, "bad").get("status") or {}).get("phase"),
                           what="status")
        await k8s.wait_for(lambda: events(k8s, "InvalidSpec"), what="InvalidSpec event")
    status = k8s.stored("trainingjobs", NS, "bad")["status"]
    assert status["phase"] == "Failed"
    assert "spec.trainer: min-instance 8 is more than max-instance 6" in status["message"]
    assert k8s.stored("paddlejobs", NS, "bad") is None


async def test_deleting_the_trainingjob_deletes_its_paddlejob(k8s_crds, api, api_client, config):
    k8s = k8s_crds
    async with running_operator(config, settings=quick_retries()):
        await apply(api, trainingjob(name="gone"))
        await wait_for_master(k8s, "gone")
        # the master's part: its deployer creates the pservers and trainers
        spec = spec_of(k8s.stored("paddlejobs", NS, "gone"), config)
        deployer = KubernetesDeployer(spec, api_client=api_client)
        await deployer.create_pservers()
        await deployer.create_trainers()
        assert k8s.stored("jobs", NS, "gone-trainer")["spec"]["template"]["spec"]["containers"][0][
            "command"] == ["sh", "-c", "python train.py"]
        await asyncio.to_thread(api.delete_namespaced_custom_object, GROUP, VERSION, NS, PLURAL, "gone")
        # generous: Kopf backs off when a patch of its races another handler's (seen in CI)
        await k8s.wait_for(lambda: k8s.stored("trainingjobs", NS, "gone") is None, timeout=60,
                           what="the TrainingJob gone (finalizer released)")
        await k8s.wait_for(lambda: k8s.stored("paddlejobs", NS, "gone") is None, timeout=60,
                           what="its PaddleJob gone, and with it the job (the PaddleJob's handlers)")
        assert k8s.stored("deployments", NS, "gone-master") is None
        # the trainers are the master's: owned by its Deployment, the garbage collector (which
        # kmock does not run) removes them with it
        owner = k8s.stored("jobs", NS, "gone-trainer")["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("Deployment", "gone-master")
    assert_operator_rights(k8s)


async def test_a_trainingjob_deleted_while_its_timer_reads_is_gone_within_seconds(k8s_crds, api, config):
    """Kopf keeps a deleted object's finalizer until its timers are out, and by default looks
    again a minute later: with the API slow, the TrainingJob's status timer is mid-read when
    the deletion comes, and the object must still go within seconds."""
    k8s = k8s_crds
    async with running_operator(config, settings=quick_retries()):
        await apply(api, trainingjob(name="busy"))
        await wait_for_master(k8s, "busy")
        # the timer's next read of the PaddleJob is slow, and finds none: it changes nothing
        # (a change would wake Kopf early), and is still running when the deletion comes
        reading = k8s.slow("get", "paddlejobs", 3.0, times=1, status=404)
        await k8s.wait_for(lambda: reading[0] > 0, what="the status timer mid-read")
        await asyncio.to_thread(api.delete_namespaced_custom_object, GROUP, VERSION, NS, PLURAL, "busy")
        await k8s.wait_for(lambda: k8s.stored("trainingjobs", NS, "busy") is None, timeout=30,
                           what="the TrainingJob gone (its finalizer released)")


async def test_a_paddlejob_of_the_name_that_is_not_the_trainingjob_s_is_left_alone(k8s_crds, api, config):
    k8s = k8s_crds
    theirs = to_paddlejob(trainingjob(name="taken"))
    theirs["metadata"]["namespace"] = NS
    await asyncio.to_thread(api.create_namespaced_custom_object, "batch.paddlepaddle.org", "v1", NS,
                            "paddlejobs", theirs)
    async with running_operator(config, settings=quick_retries()):
        await apply(api, trainingjob(name="taken"))
        await k8s.wait_for(lambda: (k8s.stored("trainingjobs", NS, "taken").get("status") or {}).get("message"),
                           what="the TrainingJob refused")
        await asyncio.to_thread(api.delete_namespaced_custom_object, GROUP, VERSION, NS, PLURAL, "taken")
        await k8s.wait_for(lambda: k8s.stored("trainingjobs", NS, "taken") is None, what="the TrainingJob gone")
    assert events(k8s, "NameTaken")
    assert k8s.stored("paddlejobs", NS, "taken") is not None  # not its to delete
    assert "ownerReferences" not in k8s.stored("paddlejobs", NS, "taken")["metadata"]
