"""Elastic jobs on Kubernetes (kmock): `scale` in PS mode, group restarts in collective mode."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import grpc
import kubernetes_validate
import pytest
from masters import pb, read_to_the_end, stub, wait_serving
from test_k8s_deployer import FAST_RETRY, NS, create_master, env_of, make_spec, short
from test_k8s_master_process import start_deploying_master
from waiting import wait_for

from paddlecloud.backends.k8s import manifests
from paddlecloud.backends.k8s.deployer import KubernetesDeployer
from paddlecloud.jobspec import JobSpecError

VERSIONS = ("1.28", kubernetes_validate.latest_version())


def check_valid(job: dict[str, Any]) -> None:
    """The Job as stored, less what the API server adds, is strictly valid (1.28 and newest)."""
    doc = copy.deepcopy(job)
    doc.pop("status", None)
    for key in ("uid", "creationTimestamp", "resourceVersion"):
        doc["metadata"].pop(key, None)
    for version in VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


class EpochRestarts:
    """RestartEpoch as the master's deployer issues it, recorded with the Job seen at that moment."""

    def __init__(self, k8s: Any, name: str) -> None:
        self.k8s, self.name = k8s, name
        self.jobs_present: list[bool] = []

    async def __call__(self) -> None:
        self.jobs_present.append(self.k8s.stored("jobs", NS, self.name) is not None)


def add_group(k8s: Any, spec: Any, size: int, generation: str) -> list[str]:
    """Plays the Job controller: one running pod per index."""
    names = [f"{manifests.trainer_name(spec.name)}-{i}-{generation}" for i in range(size)]
    for name in names:
        k8s.add_pod(spec, manifests.TRAINER, name)
    return names


async def collective_deployer(k8s: Any, api_client: Any, job_name: str, *, restart_limit: int | None = None,
                              **changes: Any) -> tuple[Any, str, EpochRestarts, KubernetesDeployer]:
    """A collective job's master Deployment and its deployer, trainers created: (spec, the
    trainer Job's name, the RestartEpoch calls it made, the deployer)."""
    spec = make_spec(short(job_name), pservers=0, **changes)
    await create_master(api_client, spec)
    trainer = manifests.trainer_name(spec.name)
    restarts = EpochRestarts(k8s, trainer)
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY, restart_epoch=restarts,
                                  restart_limit=restart_limit)
    await deployer.create_trainers()
    return spec, trainer, restarts, deployer


async def delete_pod(api_client: Any, name: str) -> None:
    from kubernetes import client

    await asyncio.to_thread(client.CoreV1Api(api_client).delete_namespaced_pod, name, NS)


@pytest.mark.unit
def test_a_range_outside_min_max_is_refused_naming_it():
    with pytest.raises(JobSpecError, match=r"5 trainers is outside the job's range 1\.\.4"):
        make_spec("bad", trainers=5, min_trainers=1, max_trainers=4)
    with pytest.raises(JobSpecError, match=r"trainer range 3\.\.2"):
        make_spec("bad", trainers=2, min_trainers=3, max_trainers=2)


async def test_ps_scale_changes_only_the_trainer_job_size(k8s, api_client, job_name):
    spec = make_spec(short(job_name), trainers=2, min_trainers=1, max_trainers=4, pservers=2)
    await create_master(api_client, spec)
    restarts = EpochRestarts(k8s, manifests.trainer_name(spec.name))
    deployer = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY, restart_epoch=restarts)
    await deployer.create_pservers()
    await deployer.create_trainers()
    trainer, ps = manifests.trainer_name(spec.name), manifests.pserver_name(spec.name)
    before = copy.deepcopy(k8s.stored("jobs", NS, trainer))
    sts_before = copy.deepcopy(k8s.stored("statefulsets", NS, ps))
    posted = k8s.posted()

    for size in (4, 1, 3):
        await deployer.scale(size)
        job = k8s.stored("jobs", NS, trainer)
        assert job["spec"]["parallelism"] == job["spec"]["completions"] == size
        assert (await deployer.trainer_status()).desired == size
        # nothing but the size changed: the pod template, the pservers, no object re-created
        assert job["spec"]["template"] == before["spec"]["template"]
        assert k8s.stored("statefulsets", NS, ps) == sts_before
        assert k8s.posted() == posted
        check_valid(job)
    assert restarts.jobs_present == []  # PS mode restarts nobody
    # a master that takes over adopts the Job at the size it was scaled to: no restart, no patch
    successor = KubernetesDeployer(spec, api_client=api_client, retry=FAST_RETRY, restart_epoch=restarts)
    await successor.create_trainers()
    patches = sum(1 for method, resource, _ in k8s.requests() if (method, resource) == ("PATCH", "jobs"))
    await successor.scale(3)
    assert successor.size == 3 and restarts.jobs_present == []
    assert sum(1 for m, r, _ in k8s.requests() if (m, r) == ("PATCH", "jobs")) == patches


async def test_collective_lost_pod_restarts_the_whole_group(k8s, api_client, job_name):
    spec, trainer, restarts, deployer = await collective_deployer(
        k8s, api_client, job_name, trainers=3, min_trainers=1, max_trainers=4)
    first = add_group(k8s, spec, 3, "a")
    await deployer.reconcile()  # the group is seen whole
    await deployer.reconcile()
    assert restarts.jobs_present == [] and k8s.posted().count(("jobs", trainer)) == 1

    await delete_pod(api_client, first[1])
    await deployer.reconcile()
    # the old Job (and with it every pod) was gone before RestartEpoch; then a new Job
    assert restarts.jobs_present == [False]
    assert k8s.posted().count(("jobs", trainer)) == 2
    job = k8s.stored("jobs", NS, trainer)
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 3
    env = env_of(job)
    assert env["PADDLE_TRAINERS_NUM"] == "3"
    assert env["PADDLE_TRAINER_ENDPOINTS"].count(",") == 2
    assert deployer.restarts == 1
    check_valid(job)


async def test_after_the_data_s_end_a_lost_pod_still_restarts_the_group_but_nothing_resizes(
        k8s, api_client, job_name):
    spec, trainer, restarts, deployer = await collective_deployer(
        k8s, api_client, job_name, trainers=2, min_trainers=1, max_trainers=4)
    first = add_group(k8s, spec, 2, "a")
    await deployer.reconcile()
    await deployer.finishing()
    await deployer.scale(4)
    assert restarts.jobs_present == [] and deployer.size == 2  # no resize once the data is done
    k8s.add_pod(spec, manifests.TRAINER, first[0], phase="Succeeded")  # one member finished
    await deployer.reconcile()
    assert restarts.jobs_present == []  # a member that finished is not lost
    await delete_pod(api_client, first[1])  # the other died before it saved
    await deployer.reconcile()
    assert restarts.jobs_present == [False] and deployer.restarts == 1
    assert k8s.posted().count(("jobs", trainer)) == 2


async def test_collective_scale_restarts_the_group_at_the_new_size(k8s, api_client, job_name):
    spec, trainer, restarts, deployer = await collective_deployer(
        k8s, api_client, job_name, trainers=2, min_trainers=1, max_trainers=4)
    add_group(k8s, spec, 2, "a")
    await deployer.reconcile()

    await deployer.scale(4)
    assert restarts.jobs_present == [False]
    job = k8s.stored("jobs", NS, trainer)
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 4
    env = env_of(job)
    assert env["PADDLE_TRAINERS_NUM"] == "4"
    host = manifests.trainer_host(spec, 0).split(".", 1)[1]
    assert env["PADDLE_TRAINER_ENDPOINTS"] == ",".join(
        f"{trainer}-{i}.{host}:{manifests.PADDLE_PORT}" for i in range(4))
    assert deployer.restarts == 0  # a resize does not count against the restart limit
    check_valid(job)


async def test_a_group_restart_loop_ends_at_the_restart_limit(k8s, api_client, job_name):
    spec, trainer, restarts, deployer = await collective_deployer(
        k8s, api_client, job_name, trainers=2, restart_limit=1)
    for generation in ("a", "b"):
        pods = add_group(k8s, spec, 2, generation)
        await deployer.reconcile()
        await delete_pod(api_client, pods[0])
        await deployer.reconcile()
    status = await deployer.trainer_status()
    assert status.gave_up and "--restart-limit 1" in status.detail
    assert restarts.jobs_present == [False]  # one restart, then it gave up
    assert k8s.stored("jobs", NS, trainer) is None


async def test_a_deploying_master_restarts_a_collective_group_on_scale_and_on_a_lost_pod(
        tmp_path, k8s, api_client, kubeconfig, etcd_endpoint, job_name, monkeypatch, start_master):
    name = short(job_name)
    spec, proc = await start_deploying_master(tmp_path, api_client, kubeconfig, etcd_endpoint,
                                              monkeypatch, start_master, name=name, namespace=NS,
                                              min_trainers=1, max_trainers=3)
    trainer = manifests.trainer_name(name)
    await wait_serving(proc.address, process=proc)
    await k8s.wait_for(lambda: k8s.stored("jobs", NS, trainer), timeout=30, what="the trainer Job")
    first = add_group(k8s, spec, 2, "a")
    async with grpc.aio.insecure_channel(proc.address) as channel:
        master = stub(channel)
        status = await master.GetStatus(pb.GetStatusRequest())
        assert (status.min_trainers, status.max_trainers, status.desired_trainers) == (1, 3, 2)
        reply = await master.ScaleTrainers(pb.ScaleTrainersRequest(trainers=3))
        assert reply.desired_trainers == 3

    def job_of_size(size: int, posts: int):
        job = k8s.stored("jobs", NS, trainer)
        return (job is not None and job["spec"]["parallelism"] == size
                and k8s.posted().count(("jobs", trainer)) == posts)

    await k8s.wait_for(lambda: job_of_size(3, 2), timeout=30, what="the group restarted at 3")
    env = env_of(k8s.stored("jobs", NS, trainer))
    assert env["PADDLE_TRAINERS_NUM"] == "3" and env["PADDLE_TRAINER_ENDPOINTS"].count(",") == 2
    await k8s.wait_for(lambda: proc.log().count("group restart: the master restarted epoch 0") == 1,
                       timeout=30, what="RestartEpoch with the scale")

    for pod in first:  # the garbage collector's part: the old Job's pods go with it
        await delete_pod(api_client, pod)
    pods = add_group(k8s, spec, 3, "b")
    await k8s.wait_for(lambda: f"the trainer group of 3 runs: {', '.join(pods)}" in proc.log(),
                       timeout=30, what="the new group seen whole")
    await delete_pod(api_client, pods[2])
    await k8s.wait_for(lambda: job_of_size(3, 3), timeout=30, what="the group restarted after a lost pod")
    await k8s.wait_for(lambda: proc.log().count("group restart: the master restarted epoch 0") == 2,
                       timeout=30, what="RestartEpoch with the lost pod")
    assert f"trainer pod(s) {pods[2]} lost: restarting the trainer group" in proc.log()


@pytest.mark.unit
def test_submit_takes_a_trainer_range_and_refuses_a_size_outside_it():
    import yaml
    from click.testing import CliRunner

    from paddlecloud.cli.jobs import job
    from paddlecloud.jobspec import JobSpec

    runner = CliRunner()
    result = runner.invoke(job, ["submit", "ela", "--module", "m.train", "--min-trainers", "2",
                                 "--max-trainers", "5", "--dry-run"])
    assert result.exit_code == 0, result.output
    docs = [d for d in yaml.safe_load_all(result.output) if d]
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "ela-spec")
    spec = JobSpec.from_yaml(config["data"]["job.yaml"])
    assert (spec.min_trainers, spec.max_trainers, spec.trainers) == (2, 5, 5)  # starts at its most
    trainers = next(d for d in docs if d["kind"] == "Job")
    assert trainers["spec"]["parallelism"] == trainers["spec"]["completions"] == 5
    refused = runner.invoke(job, ["submit", "ela", "--module", "m.train", "--trainers", "6",
                                  "--max-trainers", "5", "--dry-run"])
    assert refused.exit_code == 1 and "6 trainers is outside the job's range" in refused.output


@pytest.mark.unit
async def test_supervise_hands_the_desired_size_to_the_deployer_until_the_data_is_done():
    from test_k8s_deployer import BUSY, FakeDeployer

    from paddlecloud.supervision import Graces, MasterState, supervise

    sizes = iter([None, 2, 3, 3, 1])
    data = {"done": False}

    async def desired() -> int | None:
        return next(sizes, 1)

    async def master_state() -> MasterState:
        return MasterState(has_dataset=True, **data)

    async def no_pservers() -> int:
        return 0

    deployer = FakeDeployer([BUSY])
    task = asyncio.create_task(supervise(
        deployer, num_pservers=0, registered_pservers=no_pservers, master_state=master_state,
        poll_interval=0.01, desired_trainers=desired, graces=Graces(done=0.2)))
    await asyncio.wait_for(deployer.polled_thrice.wait(), 10)
    await wait_for(lambda: "scale(1)" in deployer.calls, timeout=10, message="no scale(1)")
    data["done"] = True
    await asyncio.wait_for(task, 20)
    scales = [c for c in deployer.calls if c.startswith("scale")]
    assert scales[:4] == ["scale(2)", "scale(3)", "scale(3)", "scale(1)"]  # None: nothing asked
    # each scale comes before the poll's reconcile; none once the data is done
    first = deployer.calls.index("scale(2)")
    assert deployer.calls[first + 1] == "reconcile"
    assert not any(c.startswith("scale") for c in deployer.calls[deployer.calls.index("finishing"):])


@pytest.mark.parametrize("final_checkpoint", [False, True])
async def test_a_member_lost_after_the_data_s_end_restarts_the_group_from_its_checkpoint(
        tmp_path, k8s, api_client, kubeconfig, etcd_endpoint, job_name, monkeypatch, start_master,
        final_checkpoint):
    """Without a checkpoint of the whole job the master reopens it (the group's work since its
    checkpoint is in no saved model); with one saved at the last epoch's end nothing is read
    again (that would count the epoch twice): the group only starts again, to save from it."""
    from trainer_agent.checkpoint import TrainStatus, save_checkpoint

    name = short(job_name)
    output = tmp_path / "out"
    spec, proc = await start_deploying_master(tmp_path, api_client, kubeconfig, etcd_endpoint,
                                              monkeypatch, start_master, name=name, namespace=NS,
                                              output=str(output))
    trainer = manifests.trainer_name(name)
    await wait_serving(proc.address, process=proc)
    await k8s.wait_for(lambda: k8s.stored("jobs", NS, trainer), timeout=30, what="the trainer Job")
    pods = add_group(k8s, spec, 2, "a")
    await k8s.wait_for(lambda: "the trainer group of 2 runs" in proc.log(), timeout=30,
                       what="the group seen whole")
    if final_checkpoint:
        save_checkpoint(str(output / "checkpoints"), {}, TrainStatus(0))  # epoch 0 of 1, finished
    async with grpc.aio.insecure_channel(proc.address) as channel:
        master = stub(channel)
        await read_to_the_end(master, trainer_id="0")
        await delete_pod(api_client, pods[1])
        await k8s.wait_for(lambda: k8s.posted().count(("jobs", trainer)) == 2, timeout=30,
                           what="the group restarted")
        log = proc.log()
        assert f"trainer pod(s) {pods[1]} lost: restarting the trainer group" in log
        status = await master.GetStatus(pb.GetStatusRequest())
        if final_checkpoint:
            assert "the checkpoint holds the whole job: no epoch to restart" in log
            assert (status.phase, status.counts.done) == ("Succeeded", status.num_tasks)
        else:
            assert "group restart: the master restarted epoch 0" in log
            assert (status.phase, status.counts.todo) == ("Running", status.num_tasks)
