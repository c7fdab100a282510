"""KubernetesDeployer and supervise() against an emulated API server and a real etcd.

The deployer talks to kmock through the official client over HTTP; pservers
"register" by the test putting their `pservers/<i>` keys in the real etcd, as the
pserver agent would.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
import waiting
from conftest import role_grants

from paddlecloud.backends.k8s import manifests
from paddlecloud.backends.k8s.client import (
    KubernetesApiError,
    KubernetesConflictError,
    KubernetesPermissionError,
    RetryPolicy,
)
from paddlecloud.backends.k8s.deployer import KubernetesDeployer, role_status_of_job, should_clean
from paddlecloud.deployer import Deployer, RoleStatus
from paddlecloud.etcd import connect
from paddlecloud.jobspec import JobSpec
from paddlecloud.keys import JobKeys
from paddlecloud.phase import Phase
from paddlecloud.supervision import Graces, MasterState, supervise

FAILED, RUNNING, SUCCEEDED = Phase.FAILED, Phase.RUNNING, Phase.SUCCEEDED

FAST_RETRY = RetryPolicy(attempts=3, initial_wait=0.01, max_wait=0.05)
NS = "team-a"


def make_spec(name: str, **changes: Any) -> JobSpec:
    values: dict[str, Any] = {"name": name, "namespace": NS, "module": "ctr.train",
                              "trainers": 3, "pservers": 2}
    values.update(changes)
    return JobSpec(**values).validate()


def short(job_name: str) -> str:
    """The test's job name cut to a valid job name (<= 40 chars, ends alphanumeric)."""
    return job_name[-40:].lstrip("-0123456789") or "job"


async def create_master(api_client: Any, spec: JobSpec) -> str:
    """What `paddlecloud job submit` would have made: the master Deployment. Returns its uid."""
    from kubernetes import client

    made = await asyncio.to_thread(client.AppsV1Api(api_client).create_namespaced_deployment,
                                   spec.namespace, manifests.master_deployment(spec))
    return made.metadata.uid


async def no_dataset() -> MasterState:
    """A job without a dataset (deploy-and-monitor): its trainers alone say when it ends."""
    return MasterState(has_dataset=False)


def env_of(obj: dict[str, Any]) -> dict[str, Any]:
    container = obj["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.fixture
async def etcd(etcd_endpoint: str):
    client = await connect(etcd_endpoint)
    yield client
    await client.close()


class Recorder:
    """set_phase as the master would call it, plus what registered_pservers() was asked."""

    def __init__(self, etcd: Any, keys: JobKeys) -> None:
        self.etcd, self.keys = etcd, keys
        self.phases: list[str] = []
        self.polls = 0

    async def set_phase(self, phase: Phase, reason: str) -> None:
        await self.etcd.put(self.keys.phase, phase.value.encode())
        self.phases.append(phase)

    async def registered(self) -> int:
        self.polls += 1
        return len(list(await self.etcd.get_prefix(self.keys.kind_prefix("pservers"))))


async def test_trainers_are_created_only_after_every_pserver_registered(
        k8s, api_client, etcd, job_name):
    spec = make_spec(short(job_name))
    uid = await create_master(api_client, spec)
    keys = JobKeys(NS, spec.name)
    rec = Recorder(etcd, keys)
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    task = asyncio.create_task(supervise(
        deployer, num_pservers=2, registered_pservers=rec.registered, set_phase=rec.set_phase,
        master_state=no_dataset, poll_interval=0.01))
    try:
        ps, trainer = manifests.pserver_name(spec.name), manifests.trainer_name(spec.name)
        await k8s.wait_for(lambda: rec.polls >= 3, what="supervise polling the pservers")
        assert k8s.stored("statefulsets", NS, ps) is not None
        assert k8s.stored("jobs", NS, trainer) is None
        assert rec.phases == ["Pending", "Starting"]

        await etcd.put(keys.pserver(0), f"{manifests.pserver_host(spec, 0)}:36000".encode())
        polls = rec.polls
        await k8s.wait_for(lambda: rec.polls >= polls + 3, what="more polls with 1 of 2 pservers")
        assert k8s.stored("jobs", NS, trainer) is None, "trainers created before every pserver"

        await etcd.put(keys.pserver(1), f"{manifests.pserver_host(spec, 1)}:36000".encode())
        await k8s.wait_for(lambda: k8s.stored("jobs", NS, trainer) is not None,
                           what="the trainer Job")
        await k8s.wait_for(lambda: RUNNING in rec.phases, what="phase Running")
        assert k8s.posted() == [("deployments", manifests.master_name(spec.name)),
                                ("services", ps), ("statefulsets", ps), ("jobs", trainer)]

        # everything the master made is owned by the master Deployment, with the API's uid
        for resource, name in (("services", ps), ("statefulsets", ps), ("jobs", trainer)):
            owners = k8s.stored(resource, NS, name)["metadata"]["ownerReferences"]
            assert owners == [manifests.owner_reference(spec.name, uid)]
            assert owners[0]["kind"] == "Deployment" and owners[0]["uid"] == uid

        job = k8s.stored("jobs", NS, trainer)
        assert job["spec"]["completionMode"] == "Indexed"
        assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
        env = env_of(job)
        assert env["PADDLE_TRAINER_ID"] == {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
        assert env["TRAINING_ROLE"] == "TRAINER"
        assert env["PADDLE_PSERVERS_IP_PORT_LIST"] == (
            f"{ps}-0.{ps}.{NS}.svc:36000,{ps}-1.{ps}.{NS}.svc:36000")
        assert env["PADDLE_MASTER_ENDPOINT"] == f"{spec.name}-master.{NS}.svc:8080"
        sts_env = env_of(k8s.stored("statefulsets", NS, ps))
        assert sts_env["TRAINING_ROLE"] == "PSERVER"
        assert sts_env["POD_IP"] == f"$(POD_NAME).{ps}.{NS}.svc"

        k8s.set_job_status(NS, trainer, {"succeeded": 3, "conditions": [
            {"type": "Complete", "status": "True"}]})
        assert (await asyncio.wait_for(task, 20)).phase == SUCCEEDED
    finally:
        task.cancel()
    assert rec.phases == ["Pending", "Starting", "Running", "Succeeded"]
    assert (await etcd.get(keys.phase)).value == b"Succeeded"
    deployment = k8s.stored("deployments", NS, manifests.master_name(spec.name))
    assert deployment["metadata"]["annotations"][manifests.PHASE_ANNOTATION] == "Succeeded"
    # OnCompletion (the default) removes the pods of a job that succeeded
    assert k8s.stored("jobs", NS, trainer) is None
    assert k8s.stored("statefulsets", NS, ps) is None
    assert k8s.stored("services", NS, ps) is None


@pytest.mark.parametrize("collective", [False, True])
async def test_a_role_workload_deleted_by_hand_mid_run_is_created_again_by_the_master(
        k8s, api_client, collective):
    """No operator here: the master's own supervisor creates it again (one deployer per job);
    a collective group so lost restarts at the checkpoint, not counted as a failure."""
    from kubernetes import client

    spec = make_spec("byhand-c" if collective else "byhand", pservers=0 if collective else 2)
    await create_master(api_client, spec)
    restarts: list[int] = []

    async def restart_epoch() -> None:
        restarts.append(1)

    async def registered() -> int:
        return spec.pservers

    async def data() -> MasterState:
        return MasterState(has_dataset=True)

    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY,
                                  restart_epoch=restart_epoch)
    task = asyncio.create_task(supervise(deployer, num_pservers=spec.pservers,
                                         registered_pservers=registered, master_state=data,
                                         poll_interval=0.02))
    trainer, ps = manifests.trainer_name(spec.name), manifests.pserver_name(spec.name)
    batch, apps = client.BatchV1Api(api_client), client.AppsV1Api(api_client)
    try:
        await k8s.wait_for(lambda: k8s.stored("jobs", NS, trainer), what="the trainers")
        await asyncio.to_thread(batch.delete_namespaced_job, trainer, NS)
        await k8s.wait_for(lambda: k8s.stored("jobs", NS, trainer), what="the trainers again")
        if not collective:
            await asyncio.to_thread(apps.delete_namespaced_stateful_set, ps, NS)
            await k8s.wait_for(lambda: k8s.stored("statefulsets", NS, ps), what="pservers again")

        def said() -> str:
            deployment = k8s.stored("deployments", NS, manifests.master_name(spec.name))
            return deployment["metadata"]["annotations"].get(manifests.RECREATED_ANNOTATION, "")

        await k8s.wait_for(lambda: said().startswith("1" if collective else "2"),
                           what="the master's word on it")
        assert not task.done()
    finally:
        task.cancel()
    assert f"{ps if not collective else trainer} deleted by hand" in said()
    assert restarts == ([1] if collective else [])
    assert deployer.restarts == 0  # nothing failed: no group restart counted
    job = k8s.stored("jobs", NS, trainer)
    assert job["metadata"]["ownerReferences"][0]["name"] == manifests.master_name(spec.name)


async def test_trainers_failing_for_good_end_the_job_failed(k8s, api_client, etcd, job_name):
    spec = make_spec(short(job_name), pservers=0, trainers=2)  # collective: no pserver to wait for
    await create_master(api_client, spec)
    rec = Recorder(etcd, JobKeys(NS, spec.name))
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    task = asyncio.create_task(supervise(
        deployer, num_pservers=0, registered_pservers=rec.registered, set_phase=rec.set_phase,
        master_state=no_dataset, poll_interval=0.01))
    try:
        trainer = manifests.trainer_name(spec.name)
        await k8s.wait_for(lambda: RUNNING in rec.phases, what="phase Running")
        # a pod failed and is being replaced: not the end
        k8s.set_job_status(NS, trainer, {"active": 0, "failed": 1})
        polls_before = len(k8s.requests())
        await k8s.wait_for(lambda: len(k8s.requests()) >= polls_before + 3, what="more polls")
        assert not task.done()
        k8s.set_job_status(NS, trainer, {"failed": 12, "conditions": [
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]})
        assert (await asyncio.wait_for(task, 20)).phase == FAILED
    finally:
        task.cancel()
    assert rec.phases[-1] == "Failed"
    # OnCompletion keeps the pods of a failed job, for their logs
    assert k8s.stored("jobs", NS, trainer) is not None
    assert k8s.stored("services", NS, trainer) is not None  # collective: trainer Service


@pytest.mark.parametrize("policy, succeeded, removed", [
    ("Always", True, True), ("Always", False, True),
    ("OnFailure", True, False), ("OnFailure", False, True),
    ("OnCompletion", True, True), ("OnCompletion", False, False),
    ("Never", True, False), ("Never", False, False),
])
async def test_cleanup_follows_clean_pod_policy(k8s, api_client, policy, succeeded, removed):
    spec = make_spec("clean-" + policy.lower(), clean_pod_policy=policy)
    await create_master(api_client, spec)
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    await deployer.create_pservers()
    await deployer.create_trainers()
    await deployer.cleanup(succeeded=succeeded)
    ps, trainer = manifests.pserver_name(spec.name), manifests.trainer_name(spec.name)
    for resource, name in (("jobs", trainer), ("statefulsets", ps), ("services", ps)):
        assert (k8s.stored(resource, NS, name) is None) == removed, (resource, policy, succeeded)
    assert should_clean(policy, succeeded=succeeded) == removed
    # the master itself always stays, so the job can still be inspected
    assert k8s.stored("deployments", NS, manifests.master_name(spec.name)) is not None


async def test_volcano_podgroup_grows_from_the_pservers_to_the_whole_gang(k8s, api_client):
    worker = {"spec": {"schedulerName": "volcano", "containers": [
        {"name": "paddle", "image": "img", "command": ["python", "-m", "ctr.train"]}]}}
    spec = make_spec("gang", scheduler_name="volcano", queue="research",
                     worker_template=worker, ps_template=worker)
    uid = await create_master(api_client, spec)
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    await deployer.create_pservers()
    group = k8s.stored("podgroups", NS, "gang")
    # the trainers come only after the pservers registered: a gang of all five could not form yet
    assert group["spec"]["minMember"] == 2
    await deployer.create_trainers()
    group = k8s.stored("podgroups", NS, "gang")
    assert group["spec"] == {"minMember": 5, "queue": "research"}
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1" and group["kind"] == "PodGroup"
    assert group["metadata"]["ownerReferences"][0]["uid"] == uid
    for resource, name in (("statefulsets", "gang-ps"), ("jobs", "gang-trainer")):
        template = k8s.stored(resource, NS, name)["spec"]["template"]
        assert template["spec"]["schedulerName"] == "volcano"
        assert template["metadata"]["annotations"][manifests.PODGROUP_ANNOTATION] == "gang"
    assert k8s.posted().index(("podgroups", "gang")) < k8s.posted().index(("statefulsets", "gang-ps"))
    await deployer.cleanup(succeeded=True)
    assert k8s.stored("podgroups", NS, "gang") is None


async def test_a_new_leader_adopts_what_the_old_one_created(k8s, api_client, etcd, job_name):
    spec = make_spec(short(job_name))
    await create_master(api_client, spec)
    keys = JobKeys(NS, spec.name)
    for i in range(2):
        await etcd.put(keys.pserver(i), b"registered")
    first = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    await first.create_pservers()
    await first.create_trainers()
    creates = len(k8s.posted())
    reads = k8s.requests().count(("GET", "jobs", None))

    # the old leader died; a new one runs the whole supervision again from Running
    rec = Recorder(etcd, keys)
    second = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    task = asyncio.create_task(supervise(
        second, num_pservers=2, registered_pservers=rec.registered, set_phase=rec.set_phase,
        master_state=no_dataset, poll_interval=0.01, initial_phase=RUNNING))
    try:
        await k8s.wait_for(lambda: k8s.requests().count(("GET", "jobs", None)) > reads,
                           what="the new leader's read of the trainer Job")
        assert len(k8s.posted()) == creates  # found, and adopted: nothing created again
        k8s.set_job_status(NS, manifests.trainer_name(spec.name), {
            "succeeded": 3, "conditions": [{"type": "Complete", "status": "True"}]})
        assert (await asyncio.wait_for(task, 20)).phase == SUCCEEDED
    finally:
        task.cancel()
    assert rec.phases == ["Succeeded"]  # never backwards to Pending/Starting
    assert rec.polls == 0  # pservers were registered before: no waiting on them again

    # a leader elected after the end repeats only the clean-up: nothing is created again
    creates = len(k8s.posted())
    third = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    final = await supervise(third, num_pservers=2, registered_pservers=rec.registered,
                            set_phase=rec.set_phase, master_state=no_dataset, poll_interval=0.01,
                            initial_phase=SUCCEEDED)
    assert final.phase == SUCCEEDED and len(k8s.posted()) == creates


async def test_each_jobs_role_allows_every_call_its_master_makes_and_nothing_unused(k8s, api_client):
    worker = {"spec": {"schedulerName": "volcano", "containers": [
        {"name": "paddle", "image": "img", "command": ["python", "-m", "ctr.train"]}]}}
    spec = make_spec("rights", scheduler_name="volcano", worker_template=worker,
                     ps_template=worker, with_gloo=1, clean_pod_policy="Always", max_trainers=4)
    await create_master(api_client, spec)
    collective_spec = make_spec("rights-c", pservers=0, max_trainers=4, intranet="Service",
                                clean_pod_policy="Always")
    await create_master(api_client, collective_spec)  # what submit makes: not the master's rights
    since = len(list(k8s.kmock))
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    await deployer.create_pservers()
    await deployer.create_trainers()
    successor = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    await successor.create_pservers()  # a new leader adopts: a get
    await deployer.trainer_status()
    await deployer.scale(4)  # PS: the Job patched
    from conftest import RESOURCES

    del k8s.kmock.objects[RESOURCES["jobs"], NS, "rights-trainer"]  # deleted by hand
    await deployer.reconcile()  # read, created again, said on the Deployment
    assert k8s.stored("jobs", NS, "rights-trainer") is not None
    assert await deployer.suspend_requested() is False
    await deployer.suspend()  # drained: the Job and the StatefulSets deleted
    await deployer.show_phase(Phase.SUCCEEDED, reason="the data is done")
    await deployer.cleanup(succeeded=True)
    ps_calls = k8s.rbac_requests(since)
    since = len(list(k8s.kmock))
    collective = KubernetesDeployer(collective_spec, api_client=api_client, retry=FAST_RETRY)
    await collective.create_trainers()
    for i in range(3):
        k8s.add_pod(collective_spec, manifests.TRAINER, f"rights-c-trainer-{i}")
    await collective.reconcile()  # the group's pods listed
    await collective.scale(4)  # a group restart: the Job deleted and made again, 4 Services
    await collective.cleanup(succeeded=False)
    collective_calls = k8s.rbac_requests(since)
    assert ("", "services", "create", None) in collective_calls

    for job, calls in ((spec, ps_calls), (collective_spec, collective_calls)):
        rules = manifests.master_rules(job)
        refused = {c for c in calls if not role_grants(rules, *c)}
        assert not refused, f"the Role of {job.name} lacks {refused}"
        assert any(name and name.startswith(f"{job.name}-") for *_, name in calls)
    # and the Role grants nothing the master never uses (the union over both kinds of job)
    used = {(group, resource, verb) for group, resource, verb, _ in ps_calls | collective_calls}
    assert used == set().union(*(
        {(g, r, v) for (g, r), verbs in manifests.unscoped_rules(manifests.master_rules(job)).items()
         for v in verbs} for job in (spec, collective_spec)))


@pytest.mark.unit
def test_another_jobs_objects_are_out_of_a_masters_role():
    spec = make_spec("mine")
    rules = manifests.master_rules(spec)
    for resource, group, name in (("jobs", "batch", "other-trainer"), ("deployments", "apps", "other-master"),
                                  ("services", "", "other-ps"), ("statefulsets", "apps", "other-ps")):
        for verb in ("get", "patch", "delete"):
            assert not role_grants(rules, group, resource, verb, name)
    assert role_grants(rules, "batch", "jobs", "patch", "mine-trainer")


async def test_an_object_of_another_job_is_not_adopted(k8s, api_client):
    from kubernetes import client

    spec = make_spec("mine")
    await create_master(api_client, spec)
    other = make_spec("other")
    squatter = manifests.pserver_statefulset(other, None)
    squatter["metadata"]["name"] = manifests.pserver_name("mine")
    await asyncio.to_thread(client.AppsV1Api(api_client).create_namespaced_stateful_set, NS, squatter)
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    with pytest.raises(KubernetesConflictError, match=r"statefulsets mine-ps already exists .* "
                                                      r"does not belong to job mine"):
        await deployer.create_pservers()


async def test_a_500_on_create_is_retried_and_the_object_adopted(k8s, api_client):
    spec = make_spec("retry")
    await create_master(api_client, spec)
    answered = k8s.fail("patch", "statefulsets", status=500)
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    await deployer.create_pservers()
    assert answered == [1]
    # the first try, then the retry (an apply again, of what the first try wrote)
    assert k8s.requests().count(("PATCH", "statefulsets", None)) == 2
    assert k8s.posted().count(("statefulsets", "retry-ps")) == 1
    assert k8s.stored("statefulsets", NS, "retry-ps")["metadata"]["labels"][manifests.JOB_LABEL] == "retry"


async def test_a_503_that_persists_gives_up_with_a_clear_error(k8s, api_client):
    # (on a read: kmock stores a create before answering an injected error, so a
    # retried create always meets its own first try and is adopted, see conftest)
    spec = make_spec("broken", pservers=0)
    await create_master(api_client, spec)
    k8s.fail("get", "jobs", status=503, times=100, message="etcdserver: leader changed")
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    with pytest.raises(KubernetesApiError) as caught:
        await deployer.trainer_status()
    message = str(caught.value)
    assert "cannot get jobs broken-trainer in namespace team-a" in message
    assert "503" in message and "etcdserver: leader changed" in message
    assert k8s.requests().count(("GET", "jobs", None)) == FAST_RETRY.attempts


async def test_an_api_server_that_never_answers_fails_each_try_at_its_request_timeout(tmp_path):
    """A stalled API server (it takes the connection, answers nothing) costs each try its
    request timeout, then the call fails naming it: the master's thread is not held for ever
    (its stop waits for that thread). One connection a try: the client makes no retries of
    its own beside the policy's."""
    import socket

    from paddlecloud.backends.k8s.client import load_api_client

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: stalled\n  cluster:\n    server: http://127.0.0.1:{server.getsockname()[1]}\n"
            "users:\n- name: u\n  user:\n    token: t\n"
            "contexts:\n- name: c\n  context:\n    cluster: stalled\n    user: u\ncurrent-context: c\n")
        stalled = KubernetesDeployer(make_spec("stalled", pservers=0), api_client=load_api_client(str(kubeconfig)),
                                     retry=RetryPolicy(attempts=2, initial_wait=0.01, max_wait=0.01,
                                                       request_timeout=(5.0, 0.5)))
        with pytest.raises(KubernetesApiError) as caught:
            await asyncio.wait_for(stalled.trainer_status(), 30)
        accepted = 0
        server.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while True:
                server.accept()[0].close()
                accepted += 1
    assert "cannot get jobs stalled-trainer in namespace team-a" in str(caught.value)
    assert "timed out" in str(caught.value).lower(), caught.value
    assert accepted == 2  # both tries reached the server


async def test_a_403_names_the_verb_the_resource_and_the_rbac(k8s, api_client):
    spec = make_spec("denied")
    await create_master(api_client, spec)
    k8s.fail("patch", "jobs", status=403, times=100,
             message='jobs.batch is forbidden: User "system:serviceaccount:team-a:default" '
                     'cannot create resource "jobs"')
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    await deployer.create_pservers()
    with pytest.raises(KubernetesPermissionError) as caught:
        await deployer.create_trainers()
    message = str(caught.value)
    assert "forbidden to apply jobs denied-trainer in namespace team-a" in message
    assert "JOB-master" in message and "cannot create resource" in message
    assert k8s.posted().count(("jobs", "denied-trainer")) == 1  # a 403 is not retried


async def test_without_its_master_deployment_the_deployer_says_so(k8s, api_client):
    deployer = KubernetesDeployer(make_spec("orphan"), api_client=api_client, retry=FAST_RETRY)
    with pytest.raises(KubernetesApiError, match="master Deployment orphan-master does not exist"):
        await deployer.create_pservers()


async def test_trainer_status_reads_the_job(k8s, api_client):
    spec = make_spec("status", pservers=0)
    await create_master(api_client, spec)
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY)
    assert await deployer.trainer_status() == RoleStatus(desired=3)  # no Job yet
    await deployer.create_trainers()
    k8s.set_job_status(NS, "status-trainer", {"active": 2, "succeeded": 1})
    assert await deployer.trainer_status() == RoleStatus(desired=3, active=2, succeeded=1)


@pytest.mark.unit
def test_role_status_of_a_job_follows_its_terminal_conditions():
    running = {"status": {"active": 0, "failed": 2, "succeeded": 1}}
    assert role_status_of_job(running, desired=3).active == 1  # replacements are coming
    failed = {"status": {"failed": 4, "conditions": [{"type": "Failed", "status": "True"}]}}
    assert role_status_of_job(failed, desired=3) == RoleStatus(desired=3, active=0, failed=4)
    complete = {"status": {"succeeded": 3, "conditions": [{"type": "Complete", "status": "True"}]}}
    assert role_status_of_job(complete, desired=3).finished
    assert not role_status_of_job(None, desired=3).finished


# ---- supervise() with an in-memory deployer: the loop's rules alone -----------------------
class FakeDeployer(Deployer):
    def __init__(self, statuses: list[RoleStatus]) -> None:
        self.calls: list[str] = []
        self.statuses = statuses
        self.polled_thrice = asyncio.Event()

    async def create_pservers(self) -> None:
        self.calls.append("pservers")

    async def create_trainers(self) -> None:
        self.calls.append("trainers")

    async def scale(self, trainers: int) -> None:
        self.calls.append(f"scale({trainers})")

    async def restart_trainers(self) -> None:
        self.calls.append("restart")

    async def reconcile(self) -> None:
        self.calls.append("reconcile")

    async def finishing(self) -> None:
        self.calls.append("finishing")

    async def trainer_status(self) -> RoleStatus:
        self.calls.append("status")
        if self.calls.count("status") >= 3:
            self.polled_thrice.set()
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]

    async def show_phase(self, phase: Phase, *, reason: str = "") -> None:
        self.calls.append(f"show({phase})")

    async def cleanup(self, *, succeeded: bool) -> None:
        self.calls.append(f"cleanup(succeeded={succeeded})")


async def _no_pservers() -> int:
    return 0


BUSY = RoleStatus(desired=2, active=2)
SHORT_DONE_GRACE = Graces(done=0.2)


async def _supervise_until_the_data(
        flip: str, *, trainers: RoleStatus = BUSY,
        graces: Graces = SHORT_DONE_GRACE) -> tuple[FakeDeployer, list[str], Phase]:
    """Trainers that stay as `trainers` says; after three polls the master's data turns `flip`."""
    phases: list[str] = []
    data = {"done": False, "failed": False}

    async def set_phase(phase: Phase, reason: str) -> None:
        phases.append(phase)

    async def master_state() -> MasterState:
        return MasterState(has_dataset=True, **data)

    deployer = FakeDeployer([trainers])
    task = asyncio.create_task(supervise(
        deployer, num_pservers=0, registered_pservers=_no_pservers, set_phase=set_phase,
        master_state=master_state, poll_interval=0.01, graces=graces))
    await asyncio.wait_for(deployer.polled_thrice.wait(), 10)
    assert not task.done()  # no verdict yet: trainers busy, or within their grace
    data[flip] = True
    verdict = await asyncio.wait_for(task, 10)
    return deployer, phases, verdict.phase


@pytest.mark.unit
async def test_a_done_dataset_ends_the_job_once_the_trainers_are_out_of_grace():
    deployer, phases, final = await _supervise_until_the_data("done")
    assert final == SUCCEEDED  # the trainers hung: the grace ran out
    assert deployer.calls[-2:] == ["show(Succeeded)", "cleanup(succeeded=True)"]
    assert deployer.calls.count("finishing") == 1  # nothing is replaced once the data is done
    assert phases == ["Pending", "Starting", "Running", "Succeeded"]


@pytest.mark.unit
async def test_a_failed_dataset_fails_the_job_and_cleans_up_as_failed():
    deployer, phases, final = await _supervise_until_the_data("failed")
    assert final == FAILED  # every task of an epoch failed: the master's job is over, failed
    assert deployer.calls[-2:] == ["show(Failed)", "cleanup(succeeded=False)"]
    assert phases == ["Pending", "Starting", "Running", "Failed"]


@pytest.mark.unit
async def test_trainers_that_exit_before_the_master_knows_the_data_is_done_succeed():
    # The master's view may lag the trainers' exit (a poll, a failover): the exited
    # grace lets it catch up instead of failing the job that did consume its data.
    deployer, phases, final = await _supervise_until_the_data(
        "done", trainers=RoleStatus(desired=2, succeeded=2), graces=Graces(exited=30))
    assert final == SUCCEEDED and phases[-1] == "Succeeded"


@pytest.mark.unit
async def test_supervise_refuses_bad_arguments():
    with pytest.raises(ValueError, match="initial_phase='Done'"):
        await supervise(FakeDeployer([RoleStatus(desired=1)]), num_pservers=0,
                        registered_pservers=_no_pservers, set_phase=None,  # type: ignore[arg-type]
                        master_state=no_dataset, initial_phase="Done")  # type: ignore[arg-type]


@pytest.mark.unit
async def test_a_suspend_stops_the_job_in_place_and_its_lift_deploys_it_again_phases_unmoved():
    """The supervisor's part of a suspend: asked while it waits for pservers or watches the
    trainers, it has the deployer stop the job, creates nothing while the suspend holds, and
    deploys again from the pservers once it is lifted; no phase is written for it."""
    asked = {"now": False}
    phases: list[str] = []

    class Suspendable(FakeDeployer):
        asks = 0

        async def suspend_requested(self) -> bool:
            self.asks += 1
            return asked["now"]

        async def suspend(self) -> None:
            self.calls.append("suspend")

    async def set_phase(phase: Phase, reason: str) -> None:
        phases.append(phase)

    async def master_state() -> MasterState:
        return MasterState(has_dataset=True)

    deployer = Suspendable([BUSY])
    task = asyncio.create_task(supervise(
        deployer, num_pservers=0, registered_pservers=_no_pservers, set_phase=set_phase,
        master_state=master_state, poll_interval=0.01))
    try:
        await asyncio.wait_for(deployer.polled_thrice.wait(), 20)
        asked["now"] = True
        await waiting.wait_for(lambda: "suspend" in deployer.calls, timeout=20,
                               message="the suspend")
        held, asks = len(deployer.calls), deployer.asks
        await waiting.wait_for(lambda: deployer.asks >= asks + 5, timeout=20,
                               message="five more polls of the request")
        assert deployer.calls[held:] == []  # nothing created, scaled or read while suspended
        asked["now"] = False
        await waiting.wait_for(lambda: deployer.calls.count("trainers") == 2, timeout=20,
                               message="deployed again")
    finally:
        task.cancel()
    after = deployer.calls[deployer.calls.index("suspend"):]
    assert after[:3] == ["suspend", "pservers", "trainers"]
    assert deployer.calls.count("suspend") == 1
    assert phases == ["Pending", "Starting", "Running"]  # not moved by the suspend
