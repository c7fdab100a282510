"""A suspend mid-epoch on Kubernetes: the real master drains, and resumes at the checkpoint.

The operator's part of a suspend (docs/kubernetes.md, "spec.suspend") is played here
as it acts: it asks on the master Deployment (`suspend: "true"`, `resume-from-checkpoint:
pending`); a real `paddlecloud master` process deletes its trainer group (the trainers
drain on SIGTERM), then its pservers, and says it is suspended; then the operator stops
it. A master started again restarts the epoch at the checkpoint before it creates the new
group: the tasks the model never kept are read again, so each record is counted once —
for a collective job (the model is the checkpoint the trainers load) and a PS job alike
(the model is the checkpoint its pservers restore: what they learnt after it is gone
with them, so the tasks they learnt it from must not stay counted done).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from masters import pb, stub, wait_serving
from test_k8s_deployer import short
from test_k8s_master_process import start_deploying_master

from paddlecloud import etcd
from paddlecloud.backends.k8s import manifests
from paddlecloud.keys import JobKeys
from trainer_agent.checkpoint import TrainStatus, save_checkpoint


async def finish_tasks(address: str, count: int) -> list[int]:
    """One trainer takes `count` tasks and finishes each; their ids, in order."""
    async with grpc.aio.insecure_channel(address) as channel:
        master = stub(channel)
        registered = await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="t0"))
        finished = []
        for _ in range(count):
            reply = await master.GetTask(pb.GetTaskRequest(session_id=registered.session_id,
                                                           epoch=registered.current_epoch))
            assert reply.outcome == pb.TASK, reply
            await master.TaskFinished(pb.TaskReport(session_id=registered.session_id,
                                                    task_id=reply.task.id, epoch=reply.task.epoch,
                                                    attempt=reply.task.attempt))
            finished.append(reply.task.id)
        await master.LeaveTrainer(pb.LeaveTrainerRequest(session_id=registered.session_id))
        return finished


async def done_tasks(address: str) -> list[int]:
    async with grpc.aio.insecure_channel(address) as channel:
        listed = await stub(channel).ListTasks(pb.ListTasksRequest(state=pb.DONE))
        return sorted(task.id for task in listed.tasks)


async def register_pservers(etcd_endpoint: str, spec, *, present: bool) -> None:
    """What the pserver agents do in etcd: register on their slots (or, gone, vanish)."""
    keys = JobKeys(spec.namespace, spec.name)
    client = await etcd.connect(etcd_endpoint)
    try:
        for index, endpoint in enumerate(manifests.pserver_endpoints(spec)):
            if present:
                await client.put(keys.pserver(index), endpoint.encode())
            else:
                await client.delete(keys.pserver(index))
    finally:
        await client.close()


@pytest.mark.parametrize("pservers", [0, 2], ids=["collective", "ps"])
@pytest.mark.parametrize("saved", [False, True], ids=["no-checkpoint", "checkpoint-mid-epoch"])
async def test_a_suspend_mid_epoch_is_the_masters_drain_and_the_resume_counts_each_task_once(
        tmp_path, k8s, api_client, kubeconfig, etcd_endpoint, job_name, monkeypatch, start_master,
        pservers, saved):
    from kubernetes import client

    name, ns = short(job_name), "team-r"
    output = tmp_path / "model"
    spec, first = await start_deploying_master(tmp_path, api_client, kubeconfig, etcd_endpoint,
                                               monkeypatch, start_master, name=name, namespace=ns,
                                               output=str(output), pservers=pservers)
    await wait_serving(first.address, process=first)
    if pservers:
        await k8s.wait_for(lambda: k8s.stored("statefulsets", ns, manifests.pserver_name(name)),
                           timeout=60, what="the pservers")
        await register_pservers(etcd_endpoint, spec, present=True)
    trainers = manifests.trainer_name(name)
    await k8s.wait_for(lambda: k8s.stored("jobs", ns, trainers), timeout=60, what="the group")
    finished = await finish_tasks(first.address, 2)
    assert await done_tasks(first.address) == sorted(finished)
    if saved:  # the model (the trainers', or the pservers' with PS) kept the first task only
        save_checkpoint(str(output / "checkpoints"), {"model": "after the first task"},
                        TrainStatus(0, tasks_done=(finished[0],)))

    # the suspend, mid-epoch: asked of the master, which removes its own group and says so
    apps = client.AppsV1Api(api_client)

    def master_says(key: str) -> str | None:
        return k8s.stored("deployments", ns, manifests.master_name(name))["metadata"][
            "annotations"].get(key)

    await asyncio.to_thread(apps.patch_namespaced_deployment, manifests.master_name(name), ns,
                            {"metadata": {"annotations": {
                                manifests.SUSPEND_ANNOTATION: "true",
                                manifests.RESUME_ANNOTATION: manifests.RESUME_PENDING}}})
    await k8s.wait_for(lambda: master_says(manifests.SUSPENDED_ANNOTATION) == "true",
                       timeout=60, what="the master suspended")
    assert k8s.stored("jobs", ns, trainers) is None
    assert k8s.stored("statefulsets", ns, manifests.pserver_name(name)) is None
    deletes = [r for r in k8s.kmock if r.resource and r.resource.plural == "jobs"
               and str(r.method.value).upper() == "DELETE"]
    assert [r.data["propagationPolicy"] for r in deletes] == ["Foreground"]  # each pod's grace
    assert "suspend requested: draining the trainers" in first.log()
    # then the operator stops it (the pserver agents' registrations went with their pods),
    # and a resume starts a master again
    await asyncio.to_thread(first.stop)  # kmock, in this loop, answers its last calls meanwhile
    if pservers:
        await register_pservers(etcd_endpoint, spec, present=False)
    await asyncio.to_thread(apps.patch_namespaced_deployment, manifests.master_name(name), ns,
                            {"metadata": {"annotations": {manifests.SUSPEND_ANNOTATION: "false"}}})

    # the resume: a master again, which restarts the epoch before it creates the group
    second = start_master("--input", str(tmp_path / "data"), "--namespace", ns, "--deployer",
                          "kubernetes", "--job-spec", str(tmp_path / "job.yaml"), job=name,
                          name="master-2")
    await wait_serving(second.address, process=second)
    if pservers:  # the pservers again, on their slots (told to restore the checkpoint)
        await k8s.wait_for(lambda: k8s.stored("statefulsets", ns, manifests.pserver_name(name)),
                           timeout=60, what="the pservers again")
        await register_pservers(etcd_endpoint, spec, present=True)
    await k8s.wait_for(lambda: k8s.stored("jobs", ns, trainers), timeout=60, what="a new group")

    def resumed() -> bool:
        annotations = k8s.stored("deployments", ns, manifests.master_name(name))["metadata"][
            "annotations"]
        return annotations.get(manifests.RESUME_ANNOTATION) == manifests.RESUME_DONE
    await k8s.wait_for(resumed, timeout=30, what="the resume marked done")
    assert master_says(manifests.SUSPENDED_ANNOTATION) == ""
    # exactly what the checkpoint kept stays done; the rest is read again
    assert await done_tasks(second.address) == ([finished[0]] if saved else [])
    assert "restarted epoch 0" in second.log()
    # stopped here, not by the fixture: kmock answers in this test's loop, which no longer
    # runs when fixtures are torn down (the master's last annotation would wait for it)
    await asyncio.to_thread(second.stop)
