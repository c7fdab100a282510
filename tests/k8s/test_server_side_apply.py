"""Every change paddlecloud makes to a Kubernetes object is a server-side apply by its component.

kmock cannot emulate server-side apply: it takes an apply as a merge patch and keeps
no managedFields, so it reports no conflict of its own. What these tests check is
what the client SENDS, from kmock's request log: every PATCH is
`application/apply-patch+yaml` with the component's `fieldManager` (the master's
`paddlecloud-master`, the operator's `paddlecloud-operator`), `force` only on the
fields the component owns (docs/kubernetes.md, "Server-side apply"), every create
names the same manager, and an apply body carries only the fields the component sets
(so a user's label or annotation beside them is not its to remove). A conflict is the
API server's 409 to an apply, played here as the API server words it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_k8s_deployer import FAST_RETRY, NS, create_master, make_spec

from paddlecloud.backends.k8s import manifests
from paddlecloud.backends.k8s.client import APPLY_PATCH, KubernetesConflictError
from paddlecloud.backends.k8s.deployer import KubernetesDeployer
from paddlecloud.phase import Phase

VOLCANO = {"spec": {"schedulerName": "volcano", "containers": [
    {"name": "paddle", "image": "img", "command": ["python", "-m", "ctr.train"]}]}}


def writes(k8s: Any, since: int = 0) -> list[Any]:
    return [r for r in list(k8s.kmock)[since:]
            if str(r.method.value).upper() in ("POST", "PATCH") and r.resource is not None]


def is_true(value: Any) -> bool:
    return str(value).lower() == "true"


async def test_the_masters_changes_are_applies_forced_only_on_what_it_owns(k8s, api_client):
    spec = make_spec("ssa", pservers=2, trainers=3, min_trainers=2, max_trainers=5,
                     scheduler_name="volcano", worker_template=VOLCANO, ps_template=VOLCANO)
    await create_master(api_client, spec)
    since = len(list(k8s.kmock))
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    await deployer.create_pservers()
    await deployer.create_trainers()
    await deployer.scale(4)
    await deployer.show_phase(Phase.RUNNING)
    await deployer.show_epoch(0, 2, 3, 10)
    await deployer.show_goodput({"productive": 12.4, "startup": 3.6})

    made = writes(k8s, since)
    assert {r.params.get("fieldManager") for r in made} == {"paddlecloud-master"}
    patches = [r for r in made if str(r.method.value).upper() == "PATCH"]
    assert patches and all(r.headers["Content-Type"] == APPLY_PATCH for r in patches)
    forced = {(r.resource.plural, is_true(r.params.get("force"))) for r in patches}
    # the trainers' number and the master's own annotations are the master's; a PodGroup's
    # minMember may be a user's (the PodGroup applied with a PaddleJob): not forced
    assert forced == {("jobs", True), ("deployments", True), ("podgroups", False)}
    for request in patches:
        assert request.data["metadata"]["name"] and request.data["kind"]
    scale = next(r for r in patches if r.resource.plural == "jobs")
    assert scale.data["spec"] == {"parallelism": 4, "completions": 4}
    assert "annotations" not in scale.data["metadata"] and "labels" not in scale.data["metadata"]
    # every annotation the master shows, in each apply (an apply states all its manager keeps)
    last = [r for r in patches if r.resource.plural == "deployments"][-1]
    assert last.data["metadata"]["annotations"] == {
        manifests.PHASE_ANNOTATION: "Running", manifests.PHASE_REASON_ANNOTATION: "",
        manifests.EPOCH_ANNOTATION: "0/2", manifests.TASKS_ANNOTATION: "3/10",
        manifests.GOODPUT_ANNOTATION: "productive=12,startup=4"}


@pytest.mark.parametrize("collective", [False, True])
async def test_a_users_annotation_on_the_trainer_workload_survives_a_reconcile(
        k8s, api_client, collective):
    """A user annotates and labels the trainer Job (kubectl's merge patch); the master's
    reconciliation — a resize (PS: an apply of the Job's size; collective: a group restart,
    which deletes the Job and makes it again), a new leader adopting it, its own
    annotations — keeps both, and never removes a key it did not set."""
    from kubernetes import client

    name = "keep-c" if collective else "keep"
    spec = make_spec(name, pservers=0 if collective else 1, trainers=2, min_trainers=1,
                     max_trainers=4)
    await create_master(api_client, spec)
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    await deployer.create_pservers()
    await deployer.create_trainers()
    trainer = manifests.trainer_name(name)
    await asyncio.to_thread(
        client.BatchV1Api(api_client).patch_namespaced_job, trainer, NS,
        {"metadata": {"annotations": {"team.example.com/owner": "alice"},
                      "labels": {"cost-center": "42"}}}, field_manager="kubectl-annotate")
    since = len(list(k8s.kmock))
    await deployer.scale(3)
    await deployer.show_phase(Phase.RUNNING)
    await KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY).create_trainers()
    job = k8s.stored("jobs", NS, trainer)
    assert job["spec"]["parallelism"] == 3
    assert job["metadata"]["annotations"]["team.example.com/owner"] == "alice"
    assert job["metadata"]["labels"]["cost-center"] == "42"
    assert job["metadata"]["labels"][manifests.JOB_LABEL] == name  # ours, as rendered
    # nothing the master sent to the Job names the user's keys, or replaces its metadata
    for request in writes(k8s, since):
        if request.resource.plural == "jobs" and str(request.method.value).upper() == "PATCH":
            meta = request.data.get("metadata") or {}
            assert set(meta) <= {"name", "namespace"}, meta


async def test_a_conflict_with_another_manager_is_reported_naming_it(k8s, api_client):
    spec = make_spec("owned", pservers=2, trainers=3, scheduler_name="volcano",
                     worker_template=VOLCANO, ps_template=VOLCANO)
    await create_master(api_client, spec)
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    await deployer.create_pservers()  # the PodGroup, minMember 2 (the pservers)
    k8s.fail("patch", "podgroups", status=409, message=(
        'Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using '
        "scheduling.volcano.sh/v1beta1: .spec.minMember"))
    with pytest.raises(KubernetesConflictError,
                       match=r'(?s)forces only the fields it owns.*"kubectl-client-side-apply"'):
        await deployer.create_trainers()  # minMember 5 now: the user's field, not forced
    # not forced again, and nothing deployed past it (kmock keeps what an errored patch wrote:
    # conftest's gap 5, so the PodGroup itself says nothing here)
    applies = [r for r in writes(k8s) if r.resource.plural == "podgroups"
               and str(r.method.value).upper() == "PATCH"]
    assert len(applies) == 1 and not is_true(applies[0].params.get("force"))
    assert k8s.stored("jobs", NS, "owned-trainer") is None
