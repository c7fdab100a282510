"""A PaddleJob's life as platform tooling reads it: conditions, suspend and resume, Kueue.

The operator runs in Kopf's runner against kmock (tests/k8s/conftest.py); the tests
play kubectl, the job's master (its phase and progress annotations; its real deployer
and supervisor create, drain and remove the workloads) and Kueue (what it writes on a
Workload when it admits or evicts one).
Where the API server would bump `metadata.generation` on a spec change, kmock does
not: the tests do (`edit_spec`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import yaml
from test_operator import (
    NS,
    USER_AGENT,
    apply,
    assert_operator_rights,
    events,
    manifests_key,
    paddlejob,
    play_master,
    running_master,
    running_operator,
    stored_spec,
    wait_for_job,
)

from paddlecloud.backends.k8s import manifests
from paddlecloud.backends.k8s.deployer import KubernetesDeployer
from paddlecloud.jobspec import JobSpec, JobSpecError
from paddlecloud.paddlejob import KUEUE_QUEUE_LABEL, translate
from pdj_operator import kueue
from pdj_operator.status import goodput

MASTERS = 2  # the master Deployment's replicas when it runs (one leads, one stands by)


def status_of(k8s: Any, name: str) -> dict[str, Any]:
    return (k8s.stored("paddlejobs", NS, name) or {}).get("status") or {}


def condition(k8s: Any, name: str, kind: str) -> dict[str, Any]:
    return next((c for c in status_of(k8s, name).get("conditions") or [] if c["type"] == kind), {})


def holds(k8s: Any, name: str, kind: str, reason: str | None = None) -> bool:
    found = condition(k8s, name, kind)
    return found.get("status") == "True" and (reason is None or found.get("reason") == reason)


def edit_spec(k8s: Any, name: str, **fields: Any) -> None:
    """`kubectl patch pdj NAME --type merge -p '{"spec": ...}'`, with the generation bump a
    real API server makes on a spec change."""
    stored = k8s.stored("paddlejobs", NS, name)
    generation = int(stored["metadata"].get("generation") or 1) + 1
    k8s.kmock.objects[k8s_key("paddlejobs", name)].patch(
        {"metadata": {"generation": generation}, "spec": fields})


def k8s_key(resource: str, name: str) -> Any:
    from conftest import RESOURCES

    return (RESOURCES[resource], NS, name)


def annotate_master(k8s: Any, name: str, annotations: dict[str, str | None]) -> None:
    k8s.kmock.objects[manifests_key("deployments", manifests.master_name(name))].patch(
        {"metadata": {"annotations": annotations}})


async def deploy_as_master(k8s: Any, api_client: Any, name: str, **kwargs: Any) -> JobSpec:
    """The master's part: its deployer creates the pservers and the trainers."""
    spec = JobSpec.from_yaml(k8s.stored("configmaps", NS, manifests.spec_configmap_name(name))
                             ["data"][manifests.SPEC_KEY])
    deployer = KubernetesDeployer(spec, api_client=api_client, **kwargs)
    await deployer.create_pservers()
    await deployer.create_trainers()
    return spec


def job(name: str, *, generation: int = 1, labels: dict[str, str] | None = None,
        **spec: Any) -> dict[str, Any]:
    doc = paddlejob(name=name, **spec)
    doc["metadata"].update(generation=generation, labels=labels or {})
    return doc


# ---- conditions ------------------------------------------------------------------------------

async def test_conditions_move_through_a_jobs_life_with_reasons_and_generation(
        k8s_crds, api, api_client, config):
    k8s = k8s_crds
    async with running_operator(config):
        await apply(api, job("life", generation=3))
        await wait_for_job(k8s, "life")
        await k8s.wait_for(lambda: holds(k8s, "life", "Created", "MasterCreated"), what="Created")
        created_at = condition(k8s, "life", "Created")["lastTransitionTime"]
        assert condition(k8s, "life", "Running")["reason"] == "Pending"
        assert {c["observedGeneration"] for c in status_of(k8s, "life")["conditions"]} == {3}

        await deploy_as_master(k8s, api_client, "life")
        play_master(k8s, "life", phase="Running")
        await k8s.wait_for(lambda: holds(k8s, "life", "Running", "TrainersRunning"),
                           what="Running")
        # progress from the master's annotations: epoch 1 of 2, half its tasks: 75 %
        annotate_master(k8s, "life", {manifests.EPOCH_ANNOTATION: "1/2",
                                      manifests.TASKS_ANNOTATION: "5/10"})
        await k8s.wait_for(lambda: status_of(k8s, "life").get("percentDone") == 75,
                           what="75 % done")
        await k8s.wait_for(lambda: status_of(k8s, "life").get("eta"), what="an ETA")
        # goodput from the master's annotation: the productive share and the lost seconds
        annotate_master(k8s, "life", {manifests.GOODPUT_ANNOTATION:
                                      "productive=30,startup=8,restart=2,idle=0"})
        await k8s.wait_for(lambda: status_of(k8s, "life").get("goodput"), what="goodput")
        assert status_of(k8s, "life")["goodput"] == {
            "productivePercent": 75, "productiveSeconds": 30,
            "lostSeconds": {"startup": 8, "restart": 2}}

        # a group restart, as the master's deployer marks it on its Deployment
        annotate_master(k8s, "life", {manifests.RESTARTING_ANNOTATION: "a trainer was lost"})
        await k8s.wait_for(lambda: holds(k8s, "life", "Restarting", "GroupRestart"),
                           what="Restarting")
        assert condition(k8s, "life", "Restarting")["message"] == "a trainer was lost"
        assert condition(k8s, "life", "Running")["reason"] == "Restarting"
        annotate_master(k8s, "life", {manifests.RESTARTING_ANNOTATION: ""})
        await k8s.wait_for(lambda: holds(k8s, "life", "Running"), what="Running again")

        play_master(k8s, "life", phase="Succeeded")
        await k8s.wait_for(lambda: holds(k8s, "life", "Succeeded", "AllEpochsDone"),
                           what="Succeeded")
    final = {c["type"]: c for c in status_of(k8s, "life")["conditions"]}
    assert [c["type"] for c in status_of(k8s, "life")["conditions"]] == [
        "Created", "Running", "Restarting", "Suspended", "Succeeded", "Failed"]
    assert (final["Running"]["status"], final["Running"]["reason"]) == ("False", "JobSucceeded")
    assert (final["Failed"]["status"], final["Failed"]["reason"]) == ("False", "NotFailed")
    assert final["Created"]["lastTransitionTime"] == created_at  # never flipped
    assert status_of(k8s, "life")["percentDone"] == 100 and status_of(k8s, "life").get("eta") is None
    assert_operator_rights(k8s)


@pytest.mark.unit
@pytest.mark.parametrize("text", ["productive=1.5", "productive", "x y=3", "productive=-2"])
def test_a_malformed_goodput_annotation_is_ignored(text, caplog):
    deployment = {"metadata": {"annotations": {manifests.GOODPUT_ANNOTATION: text}}}
    assert goodput(deployment) is None
    assert "ignoring annotation" in caplog.text


@pytest.mark.unit
def test_no_goodput_before_a_second_counted():
    assert goodput({"metadata": {"annotations": {manifests.GOODPUT_ANNOTATION: "productive=0"}}}) is None
    assert goodput(None) is None


@pytest.mark.unit
def test_the_eta_extrapolates_the_jobs_own_rate():
    from pdj_operator.status import eta, percent_done

    assert percent_done("Running", (1, 4), (1, 4)) == 31  # (1 + 1/4) / 4
    assert percent_done("Running", None, None) is None
    assert eta(25, running_for=600) == "30m0s"    # a quarter in 10 minutes: 30 more
    assert eta(50, running_for=3725) == "1h2m5s"
    assert eta(0, running_for=600) is None


# ---- spec.suspend ----------------------------------------------------------------------------

def writes(k8s: Any, since: int, resources: tuple[str, ...]) -> list[tuple[str, str, str, Any]]:
    """(who: operator or master, method, resource, request) of every write on `resources`
    from request number `since`."""
    return [("operator" if r.headers.get("User-Agent") == USER_AGENT else "master",
             r.method.value.upper(), r.resource.plural, r)
            for r in list(k8s.kmock)[since:]
            if r.resource and r.resource.plural in resources
            and r.method.value.upper() in ("POST", "PATCH", "DELETE")]


async def test_a_suspend_is_the_masters_drain_then_its_stop_and_a_resume_restarts_at_the_checkpoint(
        k8s_crds, api, api_client, config):
    k8s = k8s_crds
    async with running_operator(config):
        await apply(api, job("pause", ps=None, withGloo=0))  # collective: a trainer group
        await wait_for_job(k8s, "pause")
        spec = stored_spec(k8s, "pause")
        async with running_master(spec, api_client):
            await k8s.wait_for(lambda: k8s.stored("jobs", NS, "pause-trainer"), what="trainers")
            await k8s.wait_for(lambda: holds(k8s, "pause", "Running"), what="Running")
            since = len(list(k8s.kmock))

            edit_spec(k8s, "pause", suspend=True)
            await k8s.wait_for(lambda: holds(k8s, "pause", "Suspended", "SuspendedBySpec"),
                               what="Suspended")
            await k8s.wait_for(lambda: (k8s.stored("deployments", NS, "pause-master")["spec"]
                                        ["replicas"]) == 0, what="the master stopped")
        await k8s.wait_for(lambda: status_of(k8s, "pause").get("phase") == "Suspended",
                           what="phase Suspended")
        master = k8s.stored("deployments", NS, "pause-master")
        assert master["metadata"]["annotations"][manifests.RESUME_ANNOTATION] == "pending"
        assert master["metadata"]["annotations"][manifests.SUSPENDED_ANNOTATION] == "true"
        assert k8s.stored("jobs", NS, "pause-trainer") is None
        # the operator asks, the master drains its group as a whole (each pod with its
        # grace) and says so, and only then does the operator stop the master
        done = writes(k8s, since, ("deployments", "jobs"))
        assert [(who, method, what) for who, method, what, _ in done] == [
            ("operator", "PATCH", "deployments"), ("master", "DELETE", "jobs"),
            ("master", "PATCH", "deployments"), ("operator", "PATCH", "deployments")]
        ask, drain, said, stop = (r for *_, r in done)
        assert ask.data["metadata"]["annotations"][manifests.SUSPEND_ANNOTATION] == "true"
        assert drain.data["propagationPolicy"] == "Foreground"
        assert said.data["metadata"]["annotations"][manifests.SUSPENDED_ANNOTATION] == "true"
        # a server-side apply of what the operator owns: the master's replicas, the resume mark
        assert stop.headers["Content-Type"] == "application/apply-patch+yaml"
        assert (stop.params["fieldManager"], stop.params["force"].lower()) == (
            "paddlecloud-operator", "true")
        assert stop.data["spec"] == {"replicas": 0}
        assert condition(k8s, "pause", "Failed")["status"] == "False"
        assert condition(k8s, "pause", "Running")["reason"] == "SuspendedBySpec"
        assert condition(k8s, "pause", "Suspended")["observedGeneration"] == 2
        assert events(k8s, "Suspending") and events(k8s, "Suspended")
        assert not events(k8s, "SpecChanged")

        edit_spec(k8s, "pause", suspend=False)
        await k8s.wait_for(lambda: (k8s.stored("deployments", NS, "pause-master")["spec"]
                                    ["replicas"]) == MASTERS, what="master started again")
        await k8s.wait_for(lambda: condition(k8s, "pause", "Suspended").get("status") == "False",
                           what="not Suspended")
        await k8s.wait_for(lambda: events(k8s, "Resumed"), what="Resumed event")
        master = k8s.stored("deployments", NS, "pause-master")
        assert master["metadata"]["annotations"][manifests.SUSPEND_ANNOTATION] == "false"

        # the master started again restarts the epoch at the checkpoint before the new group
        # (the trainers resume from it), once: its own group restarts do theirs
        restarts: list[bool] = []

        async def restart_epoch() -> None:
            restarts.append(k8s.stored("jobs", NS, "pause-trainer") is None)

        async with running_master(spec, api_client, restart_epoch=restart_epoch):
            await k8s.wait_for(lambda: k8s.stored("jobs", NS, "pause-trainer"), what="trainers")
            await k8s.wait_for(lambda: (k8s.stored("deployments", NS, "pause-master")["metadata"]
                                        ["annotations"][manifests.RESUME_ANNOTATION]) == "done",
                               what="the resume done")
        assert restarts == [True]
        annotations = k8s.stored("deployments", NS, "pause-master")["metadata"]["annotations"]
        assert annotations[manifests.SUSPENDED_ANNOTATION] == ""
        deployer = KubernetesDeployer(spec, api_client=api_client, restart_epoch=restart_epoch)
        await deployer.create_trainers()  # adopted: nothing restarted
        assert restarts == [True]
    assert not events(k8s, "WorkloadRecreated")
    assert_operator_rights(k8s)


async def test_a_master_that_is_not_stopped_resumes_in_place_when_the_suspend_is_lifted(
        k8s_crds, api_client):
    """The suspend request alone (no operator stops the master): the master drains, waits,
    and deploys the job again at its checkpoint once the request is lifted."""
    k8s = k8s_crds
    spec = translate(paddlejob(name="inplace")).validate()
    from kubernetes import client

    await asyncio.to_thread(client.AppsV1Api(api_client).create_namespaced_deployment, NS,
                            manifests.master_deployment(spec))

    def ask(suspend: bool) -> None:
        annotate_master(k8s, "inplace", {manifests.SUSPEND_ANNOTATION: str(suspend).lower()})

    async with running_master(spec, api_client):
        await k8s.wait_for(lambda: k8s.stored("jobs", NS, "inplace-trainer"), what="trainers")
        ask(True)
        await k8s.wait_for(lambda: k8s.stored("jobs", NS, "inplace-trainer") is None and
                           k8s.stored("statefulsets", NS, "inplace-ps") is None, what="drained")
        await k8s.wait_for(lambda: (k8s.stored("deployments", NS, "inplace-master")["metadata"]
                                    ["annotations"].get(manifests.SUSPENDED_ANNOTATION)) == "true",
                           what="suspended said")
        ask(False)
        await k8s.wait_for(lambda: k8s.stored("jobs", NS, "inplace-trainer") and
                           k8s.stored("statefulsets", NS, "inplace-ps"), what="deployed again")
        await k8s.wait_for(lambda: (k8s.stored("deployments", NS, "inplace-master")["metadata"]
                                    ["annotations"].get(manifests.SUSPENDED_ANNOTATION)) == "",
                           what="not suspended any more")


async def test_a_master_deleted_by_hand_comes_back_marked_to_resume_and_stopped_if_held(
        k8s_crds, api, api_client, config):
    """Deleting the master Deployment takes its trainers with it (the garbage collector): the
    master created again restarts the epoch at the checkpoint before its new group, as after
    a suspend; while the job is suspended it comes back stopped."""
    from kubernetes import client

    k8s = k8s_crds
    apps = client.AppsV1Api(api_client)
    async with running_operator(config):
        await apply(api, job("again", ps=None, withGloo=0))
        await wait_for_job(k8s, "again")
        play_master(k8s, "again", phase="Running")
        await k8s.wait_for(lambda: holds(k8s, "again", "Running"), what="Running")
        await asyncio.to_thread(apps.delete_namespaced_deployment, "again-master", NS)
        await k8s.wait_for(lambda: events(k8s, "MasterRecreated"), what="MasterRecreated")
        master = k8s.stored("deployments", NS, "again-master")
        assert master["metadata"]["annotations"][manifests.RESUME_ANNOTATION] == "pending"
        assert master["spec"]["replicas"] == MASTERS

        edit_spec(k8s, "again", suspend=True)
        await k8s.wait_for(lambda: holds(k8s, "again", "Suspended"), what="Suspended")
        await asyncio.to_thread(apps.delete_namespaced_deployment, "again-master", NS)
        await k8s.wait_for(lambda: len(events(k8s, "MasterRecreated")) == 2, what="again")
        await k8s.wait_for(lambda: k8s.stored("deployments", NS, "again-master"), what="master")
        assert k8s.stored("deployments", NS, "again-master")["spec"]["replicas"] == 0


async def test_a_master_that_takes_over_a_running_group_restarts_nothing(k8s_crds, api_client):
    spec = translate(paddlejob(name="over", ps=None, withGloo=0)).validate()
    deployment = manifests.master_deployment(spec)
    deployment["metadata"].setdefault("annotations", {})[manifests.RESUME_ANNOTATION] = "pending"
    from kubernetes import client

    await asyncio.to_thread(client.AppsV1Api(api_client).create_namespaced_deployment, NS,
                            deployment)
    await KubernetesDeployer(spec, api_client=api_client).create_trainers()  # the group runs
    restarts: list[int] = []

    async def restart_epoch() -> None:
        restarts.append(1)

    await KubernetesDeployer(spec, api_client=api_client,
                             restart_epoch=restart_epoch).create_trainers()
    assert restarts == []


async def test_a_group_restart_is_shown_on_the_master_while_it_lasts(k8s_crds, api_client):
    k8s = k8s_crds
    spec = translate(paddlejob(name="grp", ps=None, withGloo=0)).validate()
    from kubernetes import client

    await asyncio.to_thread(client.AppsV1Api(api_client).create_namespaced_deployment, NS,
                            manifests.master_deployment(spec))
    seen: list[str | None] = []

    async def restart_epoch() -> None:
        annotations = k8s.stored("deployments", NS, "grp-master")["metadata"].get("annotations")
        seen.append((annotations or {}).get(manifests.RESTARTING_ANNOTATION))

    deployer = KubernetesDeployer(spec, api_client=api_client, restart_epoch=restart_epoch)
    await deployer.create_trainers()
    await deployer.scale(2)
    assert seen == ["resize from 3 to 2 trainers"]
    annotations = k8s.stored("deployments", NS, "grp-master")["metadata"]["annotations"]
    assert annotations[manifests.RESTARTING_ANNOTATION] == ""


async def test_a_suspend_of_a_job_that_ended_is_refused_with_its_reason(
        k8s_crds, api, api_client, config):
    k8s = k8s_crds
    async with running_operator(config):
        await apply(api, job("over"))
        await wait_for_job(k8s, "over")
        play_master(k8s, "over", phase="Succeeded")
        await k8s.wait_for(lambda: status_of(k8s, "over").get("phase") == "Succeeded",
                           what="Succeeded")
        edit_spec(k8s, "over", suspend=True)
        await k8s.wait_for(lambda: events(k8s, "SuspendRefused"), what="SuspendRefused event")
        await asyncio.sleep(0.5)  # timer rounds that must not stop anything
    assert "already ended (Succeeded)" in events(k8s, "SuspendRefused")[0]["message"]
    assert k8s.stored("deployments", NS, "over-master")["spec"]["replicas"] == MASTERS
    assert status_of(k8s, "over")["phase"] == "Succeeded"
    assert condition(k8s, "over", "Suspended")["status"] == "False"


async def test_a_job_created_suspended_runs_nothing_until_resumed(k8s_crds, api, config):
    k8s = k8s_crds
    async with running_operator(config):
        await apply(api, job("later", suspend=True))
        await k8s.wait_for(lambda: holds(k8s, "later", "Suspended", "SuspendedBySpec"),
                           what="Suspended")
        await asyncio.sleep(0.5)
        assert k8s.stored("deployments", NS, "later-master") is None
        assert status_of(k8s, "later")["phase"] == "Suspended"
        edit_spec(k8s, "later", suspend=False)
        await k8s.wait_for(lambda: k8s.stored("deployments", NS, "later-master"), what="master")
        await k8s.wait_for(lambda: status_of(k8s, "later").get("phase") == "Pending",
                           what="Pending")
    assert k8s.stored("deployments", NS, "later-master")["spec"]["replicas"] == MASTERS


# ---- Kueue -----------------------------------------------------------------------------------

def workload_of(k8s: Any, name: str) -> dict[str, Any] | None:
    return k8s.stored("workloads", NS, kueue.workload_name(name))


def play_kueue(k8s: Any, name: str, status: dict[str, Any]) -> None:
    """What Kueue writes on a Workload's status when it admits or evicts it."""
    k8s.kmock.objects[k8s_key("workloads", kueue.workload_name(name))].patch({"status": status})


def admitted(trainers: int) -> dict[str, Any]:
    return {"admission": {"clusterQueue": "cq", "podSetAssignments": [
                {"name": "master", "count": 1}, {"name": "pserver", "count": 2},
                {"name": "trainer", "count": trainers}]},
            "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                           {"type": "Admitted", "status": "True", "reason": "Admitted"}]}


async def test_a_queued_job_is_one_workload_admitted_by_kueue_and_stopped_when_evicted(
        k8s_crds, api, api_client, config):
    k8s = k8s_crds
    worker = {**paddlejob()["spec"]["worker"], "replicas": 4, "requests": 2, "limits": 5}
    async with running_operator(config):
        await apply(api, job("queued", labels={KUEUE_QUEUE_LABEL: "team-a"}, worker=worker))
        await k8s.wait_for(lambda: workload_of(k8s, "queued"), what="the Workload")
        await k8s.wait_for(lambda: holds(k8s, "queued", "Suspended", "WaitingForAdmission"),
                           what="waiting for admission")
        wl = workload_of(k8s, "queued")
        assert wl["spec"]["queueName"] == "team-a"
        sets = {s["name"]: s for s in wl["spec"]["podSets"]}
        assert {n: (s["count"], s.get("minCount")) for n, s in sets.items()} == {
            "master": (1, None), "pserver": (2, None), "trainer": (5, 2)}  # the trainer range
        assert sets["trainer"]["template"]["spec"]["containers"][0]["image"] == "img"
        assert wl["metadata"]["ownerReferences"][0]["kind"] == "PaddleJob"
        await asyncio.sleep(0.5)  # timer rounds: nothing runs before admission
        assert k8s.stored("deployments", NS, "queued-master") is None

        play_kueue(k8s, "queued", admitted(3))  # partial admission: 3 of at most 5
        await k8s.wait_for(lambda: k8s.stored("deployments", NS, "queued-master"), what="master")
        stored = k8s.stored("configmaps", NS, manifests.spec_configmap_name("queued"))
        assert yaml.safe_load(stored["data"][manifests.SPEC_KEY])["trainers"] == 3
        async with running_master(stored_spec(k8s, "queued"), api_client):
            await k8s.wait_for(lambda: holds(k8s, "queued", "Running"), what="Running")
            evicted = admitted(3)
            evicted["conditions"].append({"type": "Evicted", "status": "True",
                                          "reason": "Preempted"})
            play_kueue(k8s, "queued", evicted)
            await k8s.wait_for(lambda: holds(k8s, "queued", "Suspended", "EvictedByKueue"),
                               what="evicted")
            await k8s.wait_for(lambda: (workload_of(k8s, "queued")["status"].get("admission")
                                        is None), what="the quota given back")
        assert k8s.stored("deployments", NS, "queued-master")["spec"]["replicas"] == 0
        assert k8s.stored("jobs", NS, "queued-trainer") is None
        assert k8s.stored("statefulsets", NS, "queued-ps") is None
        reserved = {c["type"]: c["status"] for c in workload_of(k8s, "queued")["status"]["conditions"]}
        assert reserved == {"QuotaReserved": "False", "Admitted": "False", "Evicted": "True"}
        assert condition(k8s, "queued", "Failed")["status"] == "False"

        readmitted = admitted(3)
        readmitted["conditions"].append({"type": "Evicted", "status": "False",
                                         "reason": "QuotaReserved"})
        play_kueue(k8s, "queued", readmitted)
        await k8s.wait_for(lambda: (k8s.stored("deployments", NS, "queued-master")["spec"]
                                    ["replicas"]) == MASTERS, what="running again")
    assert_operator_rights(k8s)


@pytest.mark.unit
@pytest.mark.parametrize("queue", ["Team_A", "a" * 64, "-team", "team a"])
def test_a_queue_name_that_is_not_a_label_value_is_refused_by_name(queue):
    doc = paddlejob(name="bad")
    doc["metadata"]["labels"] = {KUEUE_QUEUE_LABEL: queue}
    with pytest.raises(JobSpecError, match=r"invalid Kueue queue name '" + queue[:8]):
        translate(doc).validate()


@pytest.mark.unit
def test_suspend_must_be_a_boolean():
    with pytest.raises(JobSpecError, match="invalid spec.suspend 'yes'"):
        translate(paddlejob(name="bad", suspend="yes"))


# ---- job submit --queue ------------------------------------------------------------------------

def submit(*args: str) -> Any:
    from click.testing import CliRunner

    from paddlecloud.cli.jobs import job as job_group

    return CliRunner().invoke(job_group, ["submit", *args], catch_exceptions=False)


@pytest.fixture
def job_file(tmp_path: Any) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(paddlejob(name="queued-cli")))
    return str(path)


async def test_submit_with_a_queue_creates_the_labelled_paddlejob_for_the_operator(
        k8s_crds, kubeconfig, job_file):
    k8s = k8s_crds
    result = await asyncio.to_thread(submit, "-f", job_file, "--queue", "team-a", "--epochs", "3",
                                     "--input", "/data/train-*.csv", "-n", NS,
                                     "--kubeconfig", kubeconfig)
    assert result.exit_code == 0, result.output
    stored = k8s.stored("paddlejobs", NS, "queued-cli")
    assert stored["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a"
    assert (stored["spec"]["epochs"], stored["spec"]["input"]) == (3, ["/data/train-*.csv"])
    assert k8s.stored("deployments", NS, "queued-cli-master") is None  # the operator's to make
    create = next(r for r in k8s.kmock if r.resource and r.resource.plural == "paddlejobs")
    assert create.params["fieldManager"] == "paddlecloud-cli"


@pytest.mark.unit
def test_submit_with_a_queue_dry_run_prints_the_labelled_paddlejob(job_file):
    result = submit("-f", job_file, "--queue", "team-a", "--dry-run")
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(result.output)
    assert doc["kind"] == "PaddleJob" and doc["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a"


async def test_a_labelled_file_dry_runs_as_the_paddlejob_the_real_submit_creates(
        k8s_crds, kubeconfig, tmp_path):
    k8s = k8s_crds
    doc = paddlejob(name="labelled")
    doc["metadata"]["labels"] = {KUEUE_QUEUE_LABEL: "team-a"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    dry = submit("-f", str(path), "-n", NS, "--dry-run")
    assert dry.exit_code == 0, dry.output
    shown = yaml.safe_load(dry.output)  # one document: the PaddleJob, not the master's objects
    assert shown["kind"] == "PaddleJob" and shown["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a"
    real = await asyncio.to_thread(submit, "-f", str(path), "-n", NS, "--kubeconfig", kubeconfig)
    assert real.exit_code == 0, real.output
    assert "queued in team-a" in real.output
    stored = k8s.stored("paddlejobs", NS, "labelled")
    assert stored["spec"] == shown["spec"]
    assert {k: stored["metadata"][k] for k in shown["metadata"]} == shown["metadata"]
    assert k8s.stored("deployments", NS, "labelled-master") is None  # the operator's to make


@pytest.mark.parametrize("args, words", [
    (["--queue", "team-a", "q1"], "--queue needs -f job.yaml"),
    (["--queue", "team-a", "--server", "http://x", "-f", "FILE"], "cannot be combined with --server"),
    (["--queue", "team-a", "--module", "m.train", "-f", "FILE"],
     "--module cannot be combined with --queue"),
    (["--queue", "Team_A", "-f", "FILE"], "invalid Kueue queue name 'Team_A'"),
])
@pytest.mark.unit
def test_submit_with_a_queue_refuses_contradictions_by_name(job_file, args, words):
    result = submit(*[job_file if a == "FILE" else a for a in args])
    assert result.exit_code != 0 and words in result.output, result.output


@pytest.mark.unit
def test_a_queue_on_the_command_line_and_another_in_the_file_contradict(tmp_path):
    doc = paddlejob(name="twice")
    doc["metadata"]["labels"] = {KUEUE_QUEUE_LABEL: "team-b"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = submit("-f", str(path), "--queue", "team-a", "--dry-run")
    assert result.exit_code != 0
    assert "--queue 'team-a' contradicts the file's label" in result.output


@pytest.mark.unit
def test_a_queued_job_is_never_created_directly():
    from paddlecloud.backends.k8s.jobs import create_job

    spec = translate(job("direct", labels={KUEUE_QUEUE_LABEL: "team-a"})).validate()
    with pytest.raises(JobSpecError, match="names the Kueue queue 'team-a'"):
        create_job(None, spec=spec, objects=[])


async def test_the_python_api_queues_a_job_as_a_labelled_paddlejob(k8s_crds, kubeconfig):
    from paddlecloud.sdk import PaddleJob

    job_ = PaddleJob(job_name="sdk-queued", module="fit.train", trainers=2, namespace=NS,
                     queue="team-a")
    await asyncio.to_thread(job_.submit, kubeconfig=kubeconfig)
    stored = k8s_crds.stored("paddlejobs", NS, "sdk-queued")
    assert stored["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a"
    assert k8s_crds.stored("deployments", NS, "sdk-queued-master") is None
    with pytest.raises(JobSpecError, match="invalid Kueue queue name 'Team_A'"):
        PaddleJob(job_name="bad", module="fit.train", queue="Team_A")


@pytest.mark.parametrize("annotations, replicas, shown", [
    ({manifests.PHASE_ANNOTATION: "Running",
      manifests.RESUME_ANNOTATION: "pending"}, 0, "Suspended"),
    ({manifests.PHASE_ANNOTATION: "Running", manifests.RESUME_ANNOTATION: "pending"}, 2, "Running"),
    ({manifests.PHASE_ANNOTATION: "Running", manifests.RESUME_ANNOTATION: "done"}, 0, "Running"),
    ({manifests.PHASE_ANNOTATION: "Succeeded",
      manifests.RESUME_ANNOTATION: "pending"}, 0, "Succeeded"),
])
@pytest.mark.unit
def test_job_status_shows_a_held_job_suspended(annotations, replicas, shown):
    from paddlecloud.backends.k8s.jobs import shown_phase

    assert shown_phase(annotations, replicas=replicas)[0] == shown
