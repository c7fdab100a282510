"""`paddlecloud operator` against kmock: Kopf's own runner, real watch streams, real client.

The operator runs in `kopf.testing.KopfRunner` (a thread of its own) with the
handlers `paddlecloud operator` registers; the tests act as kubectl and as the
job's master: its phase on its Deployment, or its real deployer driven by the real
supervisor (`running_master`), which creates, re-creates and removes the workloads.
kmock runs no garbage collector: where a real cluster would collect objects through
owner references, the tests assert those references (PaddleJob -> master Deployment
and ConfigMap -> Service, StatefulSets, Job, PodGroup) and the operator's own deletes
of the master's objects; the workloads the operator never writes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml
from kopf.testing import KopfRunner

from paddlecloud.backends.k8s import manifests
from paddlecloud.backends.k8s.deployer import KubernetesDeployer
from paddlecloud.jobspec import JobSpec
from paddlecloud.keys import JobKeys
from paddlecloud.paddlejob import translate
from paddlecloud.supervision import MasterState, supervise
from pdj_operator.handlers import (
    USER_AGENT,
    JobObjects,
    OperatorConfig,
    make_registry,
    make_settings,
    spec_of,
)

NS = "ml"
REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "batch.paddlepaddle.org", "v1", "paddlejobs"


def paddlejob(name: str = "ctr", **spec: Any) -> dict[str, Any]:
    def role(replicas: int) -> dict[str, Any]:
        return {"replicas": replicas, "template": {"spec": {"containers": [
            {"name": "paddle", "image": "img", "command": ["python", "-m", "ctr.train"]}]}}}

    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PaddleJob",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"ps": role(2), "worker": role(3), "withGloo": 1, **spec}}


@contextlib.asynccontextmanager
async def running_operator(config: OperatorConfig, *args: str,
                           settings: Any = None) -> AsyncIterator[KopfRunner]:
    """The operator in Kopf's runner (`settings`: the operator's unless given); entered and
    left off the loop that serves kmock."""
    runner = KopfRunner(["run", "--verbose", "--namespace", NS, *(args or ("--standalone",))],
                        registry=make_registry(config), settings=settings or make_settings(),
                        timeout=30)
    await asyncio.to_thread(runner.__enter__)
    try:
        yield runner
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)


async def apply(api: Any, doc: dict[str, Any]) -> None:
    await asyncio.to_thread(api.create_namespaced_custom_object, GROUP, VERSION, NS, PLURAL, doc)


def events(k8s: Any, reason: str) -> list[dict[str, Any]]:
    return [obj.raw for (resource, _, _), obj in k8s.kmock.objects.items()
            if resource.plural == "events" and obj.raw.get("reason") == reason]


async def wait_for_job(k8s: Any, name: str) -> None:
    """Until the operator has made the whole job: its master's Deployment comes first (the rest
    is owned by it, so needs its uid), the Created event after the last of it."""
    await k8s.wait_for(lambda: any(e["involvedObject"]["name"] == name
                                   for e in events(k8s, "Created")),
                       what=f"the Created event of job {name}")


def play_master(k8s: Any, name: str, *, phase: str) -> None:
    """What the leading master writes: its phase, as the annotation of its Deployment."""
    k8s.kmock.objects[manifests_key("deployments", manifests.master_name(name))].patch(
        {"metadata": {"annotations": {manifests.PHASE_ANNOTATION: phase}}})


@contextlib.asynccontextmanager
async def running_master(spec: JobSpec, api_client: Any, **kwargs: Any) -> AsyncIterator[Any]:
    """The job's leading master as far as its workloads go: the real `KubernetesDeployer`
    driven by the real supervisor (a job whose data is never done, whose pservers have all
    registered), until the block ends — as a master pod stopped by the operator ends."""
    deployer = KubernetesDeployer(spec, api_client=api_client, **kwargs)

    async def registered() -> int:
        return spec.pservers

    async def data() -> MasterState:
        return MasterState(has_dataset=True)

    task = asyncio.create_task(supervise(deployer, num_pservers=spec.pservers,
                                         registered_pservers=registered, master_state=data,
                                         poll_interval=0.05))
    try:
        yield deployer
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def stored_spec(k8s: Any, name: str) -> JobSpec:
    """The job spec the operator gave the master (its ConfigMap)."""
    return JobSpec.from_yaml(k8s.stored("configmaps", NS, manifests.spec_configmap_name(name))
                             ["data"][manifests.SPEC_KEY])


KINDS = {"deployments": ("apps", "v1"), "statefulsets": ("apps", "v1"),
         "kopfpeerings": ("kopf.dev", "v1")}


def manifests_key(resource: str, name: str) -> Any:
    """The emulator's key of an object (to play a controller on it)."""
    group, version = KINDS[resource]
    return (kmock.resource(group, version, resource), NS, name)


def operator_rules() -> set[tuple[str, str, str]]:
    """(API group, resource, verb) the operator's Role in deploy/operator.yaml grants."""
    docs = [d for d in yaml.safe_load_all((REPO / "deploy/operator.yaml").read_text()) if d]
    role = next(d for d in docs if d["kind"] == "Role")
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


WORKLOADS = frozenset({"statefulsets", "jobs", "pods", "podgroups"})  # the master's to write


def operator_requests(k8s: Any) -> set[tuple[str, str, str]]:
    """(API group, resource[/subresource], RBAC verb) of every request the operator made
    (Kopf's and its client's)."""
    used = set()
    for request in list(k8s.kmock):
        agent = request.headers.get("User-Agent", "")
        if not (agent.startswith("kopf/") or agent == USER_AGENT) or request.resource is None \
                or not request.resource.plural:
            continue
        method = str(request.method.value).upper()
        if method == "GET":
            verb = "get" if request.name else ("watch" if request.params.get("watch") else "list")
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        used.add((request.resource.group, resource, verb))
    return used


def assert_operator_rights(k8s: Any) -> None:
    """Every request the operator made is granted by its Role, and none writes a workload
    (one deployer per job: the master)."""
    used = operator_requests(k8s)
    assert used, "the operator made no request"
    assert used <= operator_rules(), used - operator_rules()
    written = {(r, verb) for _, r, verb in used
               if r.split("/")[0] in WORKLOADS and verb not in ("get", "list", "watch")}
    assert not written, f"the operator wrote workloads: {sorted(written)}"


async def test_apply_creates_the_master_owned_by_the_paddlejob(k8s_crds, api, config):
    k8s = k8s_crds
    async with running_operator(config):
        await apply(api, paddlejob(elastic=1, worker={**paddlejob()["spec"]["worker"],
                                                      "requests": 2, "limits": 5}))
        await k8s.wait_for(lambda: k8s.stored("deployments", NS, "ctr-master"), what="master")
        await k8s.wait_for(lambda: k8s.stored("services", NS, "ctr-master"), what="master Service")
        await k8s.wait_for(lambda: (k8s.stored("paddlejobs", NS, "ctr").get("status") or {}).get("mode"),
                           what="status")
        await k8s.wait_for(lambda: events(k8s, "Created"), what="Created event")
    pdj = k8s.stored("paddlejobs", NS, "ctr")
    deployment = k8s.stored("deployments", NS, "ctr-master")
    # the same objects `job submit` renders, owned by the PaddleJob
    spec = translate(pdj, etcd_endpoints=config.etcd_endpoints, image=config.image).validate()
    expected = next(o for o in manifests.submit_objects(spec) if o["kind"] == "Deployment")
    assert deployment["spec"] == expected["spec"]
    owner = deployment["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "PaddleJob", "ctr", pdj["metadata"]["uid"], True)
    spec_map = k8s.stored("configmaps", NS, "ctr-spec")
    assert spec_map["metadata"]["ownerReferences"][0]["uid"] == pdj["metadata"]["uid"]
    assert yaml.safe_load(spec_map["data"]["job.yaml"])["max_trainers"] == 5
    service = k8s.stored("services", NS, "ctr-master")
    assert service["metadata"]["ownerReferences"][0]["uid"] == deployment["metadata"]["uid"]
    status = pdj["status"]
    assert (status["phase"], status["mode"]) == ("Pending", "PS")
    assert status["trainerRange"] == "2..5"
    assert status["elastic"] == "level 1: kept; the trainer range is what paddlecloud acts on"
    assert "InvalidSpec" not in str(status)
    # the master's certificate: its key in the Secret only, the CA on the PaddleJob (where a
    # re-created master finds it again) and on the Deployment (where clients read it)
    secret = k8s.stored("secrets", NS, "ctr-tokens")["data"]
    ca = base64.b64decode(secret["ca.crt"]).decode()
    assert "PRIVATE KEY" in base64.b64decode(secret["tls.key"]).decode()
    assert pdj["metadata"]["annotations"][manifests.MASTER_CA_ANNOTATION] == ca
    assert deployment["metadata"]["annotations"][manifests.MASTER_CA_ANNOTATION] == ca
    assert_operator_rights(k8s)


async def test_an_invalid_paddlejob_fails_with_its_reason_and_creates_nothing(k8s_crds, api, config):
    k8s = k8s_crds
    async with running_operator(config):
        await apply(api, paddlejob(name="typo", cleanPolicy="Never"))
        await k8s.wait_for(lambda: events(k8s, "InvalidSpec"), what="InvalidSpec event")
        await k8s.wait_for(lambda: (k8s.stored("paddlejobs", NS, "typo").get("status") or {}).get("phase"),
                           what="status")
    status = k8s.stored("paddlejobs", NS, "typo")["status"]
    assert status["phase"] == "Failed" and "did you mean spec.cleanPodPolicy?" in status["message"]
    assert "did you mean spec.cleanPodPolicy?" in events(k8s, "InvalidSpec")[0]["message"]
    assert k8s.stored("deployments", NS, "typo-master") is None


def put_podgroup(k8s: Any, name: str, **spec: Any) -> None:
    """What `kubectl apply` created of a PodGroup document in the PaddleJob's file (put in
    the emulator directly: its create reaction that versions the PaddleJob is for that)."""
    k8s.kmock.objects[kmock.resource("scheduling.volcano.sh", "v1beta1", "podgroups"), NS, name] = {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NS, "uid": str(uuid.uuid4())}, "spec": spec,
        "status": {"phase": "Pending"}}  # as the API server keeps it: not a file's field


def gang_job(name: str) -> dict[str, Any]:
    job = paddlejob(name=name)
    job["spec"]["worker"]["template"]["spec"]["schedulerName"] = "volcano"
    return job


async def test_a_podgroup_applied_with_the_paddlejob_is_the_jobs_and_its_master_adopts_it(
        k8s_crds, api, api_client, config):
    k8s = k8s_crds
    put_podgroup(k8s, "gang", minMember=3, queue="research", priorityClassName="high")
    async with running_operator(config):
        await apply(api, gang_job("gang"))
        await wait_for_job(k8s, "gang")
    # the operator records which PodGroup it is on the master Deployment, and writes none
    group = k8s.stored("podgroups", NS, "gang")
    assert manifests.JOB_LABEL not in (group["metadata"].get("labels") or {})
    master = k8s.stored("deployments", NS, "gang-master")
    assert master["metadata"]["annotations"][manifests.COMPANION_PODGROUP_ANNOTATION] == \
        group["metadata"]["uid"]
    spec = stored_spec(k8s, "gang")
    assert (spec.queue, spec.priority_class, spec.min_member) == ("research", "high", 3)
    # the master's deployer takes that one as the job's (another one not labelled so is a
    # conflict), owned by its Deployment, and its trainers' pods join it
    await KubernetesDeployer(spec, api_client=api_client).create_trainers()
    group = k8s.stored("podgroups", NS, "gang")
    assert group["metadata"]["labels"][manifests.JOB_LABEL] == "gang"
    assert [o["uid"] for o in group["metadata"]["ownerReferences"]] == [master["metadata"]["uid"]]
    assert (group["spec"]["minMember"], group["spec"]["queue"]) == (3, "research")
    pods = k8s.stored("jobs", NS, manifests.trainer_name("gang"))["spec"]["template"]
    assert pods["metadata"]["annotations"][manifests.PODGROUP_ANNOTATION] == "gang"


async def test_a_podgroup_applied_with_the_paddlejob_is_checked_against_the_jobs_size(
        k8s_crds, api, api_client, config):
    k8s = k8s_crds
    put_podgroup(k8s, "big", minMember=40)
    async with running_operator(config):
        await apply(api, gang_job("big"))
        await k8s.wait_for(lambda: events(k8s, "InvalidSpec"), what="InvalidSpec event")
    assert "PodGroup minMember 40 is more than" in events(k8s, "InvalidSpec")[0]["message"]
    assert k8s.stored("deployments", NS, "big-master") is None
    assert manifests.JOB_LABEL not in (k8s.stored("podgroups", NS, "big")["metadata"].get("labels") or {})


async def test_the_masters_phase_and_counts_reach_the_status_and_a_deleted_workload_returns(
        k8s_crds, api, api_client, config):
    k8s = k8s_crds
    from kubernetes import client

    def job_creates() -> int:
        return sum(1 for resource, name in k8s.posted() if (resource, name) == ("jobs", "ctr-trainer"))

    async with running_operator(config):
        await apply(api, paddlejob())
        await wait_for_job(k8s, "ctr")
        spec = stored_spec(k8s, "ctr")
        async with running_master(spec, api_client):  # it deploys, and writes its phase
            await k8s.wait_for(lambda: k8s.stored("jobs", NS, "ctr-trainer"), what="the trainers")
            k8s.kmock.objects[manifests_key("statefulsets", "ctr-ps")].patch(
                {"status": {"replicas": 2, "readyReplicas": 2}})
            k8s.set_job_status(NS, "ctr-trainer", {"active": 3, "ready": 2})

            def shows_running() -> bool:
                status = k8s.stored("paddlejobs", NS, "ctr").get("status") or {}
                return status.get("phase") == "Running" and \
                    (status.get("worker") or {}).get("ready") == 2

            await k8s.wait_for(shows_running, what="Running with 2 ready trainers")
            status = k8s.stored("paddlejobs", NS, "ctr")["status"]
            assert status["ps"]["summary"] == "2/2" and status["worker"]["summary"] == "2/3"
            assert {c["type"]: c["status"] for c in status["conditions"]} == {
                "Created": "True", "Running": "True", "Restarting": "False",
                "Suspended": "False", "Succeeded": "False", "Failed": "False"}
            assert status["startTime"]
            await k8s.wait_for(lambda: events(k8s, "Running"), what="Running event")

            # a role workload deleted by hand comes back, from the master's deployer (the
            # operator writes no workload: it says so in an Event on the PaddleJob)
            await asyncio.to_thread(client.BatchV1Api(api_client).delete_namespaced_job,
                                    "ctr-trainer", NS)
            await k8s.wait_for(lambda: job_creates() == 2 and k8s.stored("jobs", NS, "ctr-trainer"),
                               what="Job re-created")
            await k8s.wait_for(lambda: events(k8s, "WorkloadRecreated"),
                               what="WorkloadRecreated event")
            assert "ctr-trainer deleted by hand" in events(k8s, "WorkloadRecreated")[0]["message"]
            job = k8s.stored("jobs", NS, "ctr-trainer")
            assert job["metadata"]["ownerReferences"][0]["uid"] == \
                k8s.stored("deployments", NS, "ctr-master")["metadata"]["uid"]
            assert job["spec"] == manifests.trainer_job(spec, None)["spec"]
            await asyncio.to_thread(client.AppsV1Api(api_client).delete_namespaced_stateful_set,
                                    "ctr-ps", NS)
            await k8s.wait_for(lambda: k8s.stored("statefulsets", NS, "ctr-ps"), what="ps again")
            await k8s.wait_for(lambda: len(events(k8s, "WorkloadRecreated")) == 2,
                               what="a second WorkloadRecreated event")

        # the end: the phase is mirrored, and nothing the master removed comes back
        play_master(k8s, "ctr", phase="Succeeded")
        await asyncio.to_thread(client.BatchV1Api(api_client).delete_namespaced_job,
                                "ctr-trainer", NS)
        await k8s.wait_for(lambda: (k8s.stored("paddlejobs", NS, "ctr")["status"].get("phase")
                                    == "Succeeded"), what="Succeeded")
        await k8s.wait_for(lambda: k8s.stored("paddlejobs", NS, "ctr")["status"].get("completionTime"),
                           what="completion time")
        creates = len(k8s.posted())
        await asyncio.sleep(1.0)  # five timer rounds: a re-creation would show as a create
        assert len(k8s.posted()) == creates and k8s.stored("jobs", NS, "ctr-trainer") is None
    assert_operator_rights(k8s)


async def test_deleting_the_paddlejob_removes_everything_and_its_etcd_keys(
        k8s_crds, api, api_client, kubeconfig, etcd_endpoint):
    k8s = k8s_crds
    config = OperatorConfig(kubeconfig=kubeconfig, interval=0.2, etcd_endpoints=etcd_endpoint)
    from paddlecloud.etcd import connect

    etcd = await connect(etcd_endpoint)
    key = JobKeys(NS, "gone").prefix + b"epoch"
    await etcd.put(key, b"1")
    try:
        async with running_operator(config):
            await apply(api, paddlejob(name="gone", intranet="Service"))
            await wait_for_job(k8s, "gone")
            spec = translate(k8s.stored("paddlejobs", NS, "gone"), etcd_endpoints=etcd_endpoint,
                             image=config.image).validate()
            deployer = KubernetesDeployer(spec, api_client=api_client)
            await deployer.create_pservers()
            await deployer.create_trainers()
            uid = k8s.stored("deployments", NS, "gone-master")["metadata"]["uid"]
            owned = [(r, n) for r, n in k8s.posted() if n and n.startswith("gone-")
                     and r not in ("deployments", "configmaps", "secrets")]
            assert ("services", "gone-ps-1") in owned and ("jobs", "gone-trainer") in owned
            for resource, name in owned:  # what the garbage collector would remove
                refs = k8s.stored(resource, NS, name)["metadata"]["ownerReferences"]
                assert refs[0]["uid"] == uid, (resource, name)
            # the tokens outlive a re-created master: the PaddleJob owns them (the collector
            # removes them with it; the operator never reads or deletes a Secret itself)
            pdj_uid = k8s.stored("paddlejobs", NS, "gone")["metadata"]["uid"]
            tokens = k8s.stored("secrets", NS, "gone-tokens")["metadata"]["ownerReferences"]
            assert [r["uid"] for r in tokens] == [pdj_uid]

            await asyncio.to_thread(api.delete_namespaced_custom_object, GROUP, VERSION, NS,
                                    PLURAL, "gone")
            await k8s.wait_for(lambda: k8s.stored("paddlejobs", NS, "gone") is None,
                               what="the PaddleJob gone (finalizer released)")
        # the master's ServiceAccount, Role and RoleBinding and its workloads go with its
        # Deployment, by the garbage collector alone (owned, checked above): the operator
        # deletes no workload (the master's), nor RBAC (it has no right to)
        by_gc = ("serviceaccounts", "roles", "rolebindings", "statefulsets", "jobs")
        assert {r for r, _ in owned} >= set(by_gc)
        for resource, name in [*((r, n) for r, n in owned if r not in by_gc),
                               ("deployments", "gone-master"), ("configmaps", "gone-spec")]:
            assert k8s.stored(resource, NS, name) is None, (resource, name)
        deletes = {r for m, r, _ in k8s.requests() if m == "DELETE"}
        assert "deployments" in deletes and not deletes & {"statefulsets", "jobs", "podgroups"}
        assert (await etcd.get(key)) is None
        assert_operator_rights(k8s)
    finally:
        await etcd.close()


async def test_of_two_operators_only_the_higher_priority_acts_and_the_other_takes_over(
        k8s_crds, api, api_client, kubeconfig):
    k8s = k8s_crds
    k8s.kmock.objects[manifests_key("kopfpeerings", "pdj-test")] = {
        "apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
        "metadata": {"name": "pdj-test", "namespace": NS}}
    from kubernetes import client

    apps = client.AppsV1Api(api_client)

    def config(image: str) -> OperatorConfig:  # the image tells the two operators' work apart
        return OperatorConfig(kubeconfig=kubeconfig, interval=0.2, clear_etcd=False, image=image)

    def peers() -> int:
        return len(k8s.stored("kopfpeerings", NS, "pdj-test").get("status") or {})

    def master_image() -> str | None:
        deployment = k8s.stored("deployments", NS, "solo-master")
        return deployment and deployment["spec"]["template"]["spec"]["containers"][0]["image"]

    def created_images() -> list[str]:
        return [c["image"] for r in list(k8s.kmock)
                if str(r.method.value).upper() == "POST" and r.resource
                and r.resource.plural == "deployments"
                for c in r.data["spec"]["template"]["spec"]["containers"]]

    def status_writes() -> int:
        return sum(1 for r in list(k8s.kmock) if str(r.method.value).upper() == "PATCH"
                   and r.resource and r.resource.plural == PLURAL and r.subresource == "status")

    async def delete_master() -> None:
        await asyncio.to_thread(apps.delete_namespaced_deployment, "solo-master", NS)

    await apply(api, paddlejob(name="solo"))
    async with contextlib.AsyncExitStack() as low_stack:
        async with running_operator(config("reg/high:1"), "--peering", "pdj-test",
                                    "--priority", "200"):
            await k8s.wait_for(lambda: peers() == 1, what="the first operator in the peering")
            await k8s.wait_for(lambda: master_image() == "reg/high:1", what="master by high")
            await low_stack.enter_async_context(running_operator(
                config("reg/low:1"), "--peering", "pdj-test", "--priority", "100"))
            await k8s.wait_for(lambda: peers() == 2, what="both operators in the peering")
            # while both run, only the higher priority acts: it re-creates a deleted master
            await delete_master()
            await k8s.wait_for(lambda: master_image() == "reg/high:1", what="master again, by high")
            # five more timer rounds (each writes the status): the lower one, were it acting,
            # would have run its own timer as often and re-created the master too
            rounds = status_writes() + 5
            await k8s.wait_for(lambda: status_writes() >= rounds, what="five more timer rounds")
            assert "reg/low:1" not in created_images()
        # the higher one is gone (it left the peering): the lower one takes over
        await k8s.wait_for(lambda: peers() == 1, what="the first operator out of the peering")
        await delete_master()
        await k8s.wait_for(lambda: master_image() == "reg/low:1", what="master by low")
        # a re-created master trusts the CA of the Secret made once, not a new one
        ca = base64.b64decode(k8s.stored("secrets", NS, "solo-tokens")["data"]["ca.crt"]).decode()
        master = k8s.stored("deployments", NS, "solo-master")
        assert master["metadata"]["annotations"][manifests.MASTER_CA_ANNOTATION] == ca
        # an Event for each creation of the master: the first, and one per re-creation (by the
        # timer, MasterRecreated, or by the lower operator's resume handler, Created)
        await k8s.wait_for(lambda: len(events(k8s, "MasterRecreated")) + len(events(k8s, "Created"))
                           >= 3, timeout=60, what="an Event for each creation of the master")
    assert_operator_rights(k8s)


async def test_of_two_handlers_racing_to_create_the_master_one_creates_it(
        k8s_crds, api, api_client, config):
    """Kopf may run a handler again on a body older than its own patches, and the timer may
    run beside the creation handler: neither fails, and only one says it created the master
    (so one Event is recorded per creation)."""
    from kubernetes import client

    await apply(api, paddlejob(name="race"))
    jobs = JobObjects(config, api_client=api_client)
    stale = k8s_crds.stored(PLURAL, NS, "race")
    spec = spec_of(stale, config)
    assert await jobs.ensure_master(spec, stale) is True
    # the body from before the CA annotation: the Secret found is the job's own, not a stranger's
    assert manifests.MASTER_CA_ANNOTATION not in (stale["metadata"].get("annotations") or {})
    assert await jobs.ensure_master(spec, stale) is False
    await asyncio.to_thread(client.AppsV1Api(api_client).delete_namespaced_deployment,
                            manifests.master_name("race"), NS)
    fresh = k8s_crds.stored(PLURAL, NS, "race")
    created = await asyncio.gather(jobs.ensure_master(spec, fresh), jobs.ensure_master(spec, fresh))
    assert sorted(created) == [False, True]
    assert k8s_crds.stored("deployments", NS, manifests.master_name("race")) is not None


@pytest.mark.unit
def test_the_operator_manifest_is_strictly_valid_and_least_privilege():
    import kubernetes_validate

    docs = [d for d in yaml.safe_load_all((REPO / "deploy/operator.yaml").read_text()) if d]
    for doc in docs:
        if doc["kind"] == "KopfPeering":  # its CRD is in the same file
            continue
        for version in ("1.28", kubernetes_validate.latest_version()):
            kubernetes_validate.validate(doc, version, strict=True)
    kinds = [d["kind"] for d in docs]
    assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds
    assert all(verb not in {"*", "deletecollection", "escalate", "bind", "impersonate"}
               for _, _, verb in operator_rules())
    # pods: list only, and Roles and their bindings: no more than creating a job's master
    # Role needs (the API server lets it grant only what it holds: the master's list of pods)
    assert {verb for _, resource, verb in operator_rules() if resource == "pods"} == {"list"}
    assert {verb for _, resource, verb in operator_rules()
            if resource in {"roles", "rolebindings"}} == {"get", "create", "patch"}
    # Secrets: it creates the job's tokens, and can read none
    assert {verb for _, resource, verb in operator_rules() if resource == "secrets"} == {"create"}
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--peering=paddlecloud-operator" in args
    peering = next(d for d in docs if d["kind"] == "KopfPeering")
    assert peering["metadata"]["name"] == "paddlecloud-operator"


@pytest.mark.unit
def test_the_operator_command_needs_a_scope():
    from click.testing import CliRunner

    from paddlecloud.cli.main import main

    result = CliRunner().invoke(main, ["operator"])
    assert result.exit_code == 2 and "--namespace NS" in result.output
    result = CliRunner().invoke(main, ["operator", "-n", "ml", "-A"])
    assert result.exit_code == 2 and "--all-namespaces" in result.output
    result = CliRunner().invoke(main, ["operator", "-n", "ml", "--interval", "-1s"])
    assert result.exit_code == 2 and "'-1s'" in result.output


async def test_epoch_progress_comes_from_the_masters_deployment_annotation(k8s_crds, api, config):
    """The leading master annotates its Deployment with the epoch (a real deploying master
    does: tests/k8s/test_k8s_master_process.py); the operator shows it without calling the
    master, which serves TLS to the job's token holders only."""
    k8s = k8s_crds
    name = f"epochs-{uuid.uuid4().hex[:6]}"
    async with running_operator(config):
        await apply(api, paddlejob(name=name))
        await wait_for_job(k8s, name)
        assert "epoch" not in (k8s.stored("paddlejobs", NS, name).get("status") or {})
        annotate = k8s.kmock.objects[manifests_key("deployments", manifests.master_name(name))].patch
        annotate({"metadata": {"annotations": {manifests.EPOCH_ANNOTATION: "1/3",
                                               manifests.PHASE_ANNOTATION: "Running"}}})
        await k8s.wait_for(lambda: (k8s.stored("paddlejobs", NS, name).get("status") or {}).get(
            "epoch") == "1/3", what="epoch 1/3 in the status")
        annotate({"metadata": {"annotations": {manifests.EPOCH_ANNOTATION: "3/3",
                                               manifests.PHASE_ANNOTATION: "Succeeded"}}})
        await k8s.wait_for(lambda: (k8s.stored("paddlejobs", NS, name).get("status") or {}).get(
            "epoch") == "3/3", what="epoch 3/3 once Succeeded")
    assert k8s.stored("paddlejobs", NS, name)["status"]["phase"] == "Succeeded"


@pytest.mark.unit
def test_conditions_move_their_transition_time_only_when_they_change():
    from pdj_operator.status import Observed, conditions

    first = conditions(Observed("Running", generation=1), now="t1")
    assert {c["type"]: c["status"] for c in first} == {
        "Created": "True", "Running": "True", "Restarting": "False", "Suspended": "False",
        "Succeeded": "False", "Failed": "False"}
    same = conditions(Observed("Running", generation=2), now="t2", previous=first)
    assert [c["lastTransitionTime"] for c in same] == ["t1"] * 6
    assert {c["observedGeneration"] for c in same} == {2}
    done = {c["type"]: c for c in conditions(Observed("Succeeded", generation=2), now="t3",
                                             previous=same)}
    assert (done["Running"]["status"], done["Running"]["lastTransitionTime"]) == ("False", "t3")
    assert (done["Succeeded"]["status"], done["Succeeded"]["lastTransitionTime"]) == ("True", "t3")
    assert (done["Failed"]["lastTransitionTime"], done["Created"]["lastTransitionTime"]) == ("t1", "t1")


@pytest.mark.parametrize("phase, annotation, shown", [
    ("Running", "1/3", "1/3"), ("Succeeded", "2/3", "3/3"), ("Running", "0/0", None),
    ("Running", None, None), ("Running", "one/3", None), ("Running", "-1/3", None)])
@pytest.mark.unit
def test_epoch_progress_counts_the_epochs_done(phase, annotation, shown):
    from pdj_operator.status import epoch_progress, master_epochs

    annotations = {} if annotation is None else {manifests.EPOCH_ANNOTATION: annotation}
    deployment = {"metadata": {"annotations": annotations}}
    assert epoch_progress(phase, master_epochs(deployment)) == shown
