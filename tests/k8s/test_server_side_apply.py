"""Every object paddlecloud creates or changes is a server-side apply by its component.

The `kmock` fixture plays the API server's server-side apply (tests/k8s/conftest.py, gap
9): an apply to an absent object creates it, an apply merges only the fields it states,
removes those its manager stated before and omits now, and answers 409 naming the manager
and the field when another manager owns a field it would change (unless forced). These
tests check what the master SENDS (every write a PATCH `application/apply-patch+yaml`
with the `paddlecloud-master` field manager, `force` only on the fields it owns:
docs/kubernetes.md, "Server-side apply") and what the API server then holds (a user's
label or annotation on a workload survives; a conflict is reported, not overwritten).
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
    assert not [r for r in made if str(r.method.value).upper() == "POST"]  # creates are applies
    forced = {(r.resource.plural, is_true(r.params.get("force"))) for r in patches}
    # the trainers' number and the master's own annotations are the master's; a PodGroup's
    # minMember may be a user's (the PodGroup applied with a PaddleJob): not forced; nor is
    # any create (an object of that name is read first, and adopted only when the job's)
    assert forced == {("jobs", True), ("deployments", True), ("podgroups", False),
                      ("services", False), ("statefulsets", False), ("jobs", False)}
    for request in patches:
        assert request.data["metadata"]["name"] and request.data["kind"]
    assert sorted(p for p in k8s.posted() if p[0] != "deployments") == sorted([
        ("podgroups", "ssa"), ("services", "ssa-ps"), ("statefulsets", "ssa-ps"),
        ("jobs", "ssa-trainer")])
    scale = next(r for r in patches if r.resource.plural == "jobs" and is_true(r.params["force"]))
    # the Job as created, at the new size: its pods' template (3 trainers) cannot change
    assert scale.data["spec"]["parallelism"] == scale.data["spec"]["completions"] == 4
    created = next(r for r in patches if r.resource.plural == "jobs" and r is not scale)
    assert scale.data["spec"]["template"] == created.data["spec"]["template"]
    job = k8s.stored("jobs", NS, "ssa-trainer")
    assert job["spec"]["parallelism"] == 4 and job["metadata"]["labels"][manifests.JOB_LABEL] == "ssa"
    assert k8s.managers("jobs", NS, "ssa-trainer")["paddlecloud-master (Apply)"] >= {
        ".spec.parallelism", ".spec.completions", ".metadata.labels.paddlecloud.org/job"}
    # every annotation the master shows, in each apply (an apply states all its manager keeps)
    last = [r for r in patches if r.resource.plural == "deployments"][-1]
    assert last.data["metadata"]["annotations"] == {
        manifests.PHASE_ANNOTATION: "Running", manifests.PHASE_REASON_ANNOTATION: "",
        manifests.EPOCH_ANNOTATION: "0/2", manifests.TASKS_ANNOTATION: "3/10",
        manifests.GOODPUT_ANNOTATION: "productive=12,startup=4"}


async def user_edits(api_client: Any, name: str, manager: str, metadata: dict) -> None:
    """What `kubectl annotate`/`kubectl label` send: a merge patch naming their field manager."""
    from kubernetes import client

    await asyncio.to_thread(client.BatchV1Api(api_client).patch_namespaced_job, name, NS,
                            {"metadata": metadata}, field_manager=manager)


@pytest.mark.parametrize("collective", [False, True])
async def test_a_users_annotation_on_the_trainer_workload_survives_a_reconcile(
        k8s, api_client, collective):
    """A user annotates and labels the trainer Job (kubectl's merge patch); the master's
    reconciliation — a resize (PS: an apply of the whole Job at its new size; collective: a
    group restart, which deletes the Job and makes it again), a new leader adopting it and
    resizing again, its own annotations — keeps both, and never states them itself."""
    name = "keep-c" if collective else "keep"
    spec = make_spec(name, pservers=0 if collective else 1, trainers=2, min_trainers=1,
                     max_trainers=4)
    await create_master(api_client, spec)
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    await deployer.create_pservers()
    await deployer.create_trainers()
    trainer = manifests.trainer_name(name)
    await user_edits(api_client, trainer, "kubectl-annotate", {
        "annotations": {"team.example.com/owner": "alice"}, "labels": {"cost-center": "42"}})

    await deployer.scale(3)
    await deployer.show_phase(Phase.RUNNING)
    # a master that takes over runs everything again (the Job found and adopted)
    successor = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    await successor.create_pservers()
    await successor.create_trainers()
    await successor.scale(4)

    job = k8s.stored("jobs", NS, trainer)
    assert job["spec"]["parallelism"] == 4
    assert job["metadata"]["annotations"]["team.example.com/owner"] == "alice"
    assert job["metadata"]["labels"]["cost-center"] == "42"
    assert job["metadata"]["labels"][manifests.JOB_LABEL] == name  # and the master's own
    applies = [r for r in writes(k8s) if r.resource.plural == "jobs"
               and r.params.get("fieldManager") == "paddlecloud-master"]
    assert applies and all(r.headers["Content-Type"] == APPLY_PATCH for r in applies)
    assert not any("team.example.com/owner" in str(r.data) for r in applies)
    user_fields = {".metadata.annotations.team.example.com/owner", ".metadata.labels.cost-center"}
    owners = k8s.managers("jobs", NS, trainer)
    if collective:  # the Job made again carries them by a manager of their own, not the master's
        assert not user_fields & set().union(*(fields for manager, fields in owners.items()
                                              if manager.startswith("paddlecloud-master")))
    else:  # the user's fields are still the user's
        assert owners["kubectl-annotate (Update)"] == user_fields


async def test_a_conflict_with_another_manager_is_reported_naming_it(k8s, api_client):
    from kubernetes import client

    spec = make_spec("owned", pservers=2, trainers=3, scheduler_name="volcano",
                     worker_template=VOLCANO, ps_template=VOLCANO)
    await create_master(api_client, spec)
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    await deployer.create_pservers()  # the PodGroup, minMember 2 (the pservers)
    # a user sets the gang by hand: the field is theirs now
    await asyncio.to_thread(
        client.CustomObjectsApi(api_client).patch_namespaced_custom_object,
        "scheduling.volcano.sh", "v1beta1", NS, "podgroups", "owned", {"spec": {"minMember": 3}},
        field_manager="kubectl-edit")
    with pytest.raises(KubernetesConflictError, match=(
            r'(?s)forces only the fields it owns.*conflict with "kubectl-edit" using '
            r"scheduling.volcano.sh/v1beta1: .spec.minMember")):
        await deployer.create_trainers()  # minMember 5 now: the user's field, not forced
    # not overwritten, not forced, and nothing deployed past it
    assert k8s.stored("podgroups", NS, "owned")["spec"]["minMember"] == 3
    applies = [r for r in writes(k8s) if r.resource.plural == "podgroups"
               and str(r.method.value).upper() == "PATCH" and r.params.get("fieldManager")
               == "paddlecloud-master"]
    assert len(applies) == 2 and not any(is_true(r.params.get("force")) for r in applies)
    assert k8s.stored("jobs", NS, "owned-trainer") is None
