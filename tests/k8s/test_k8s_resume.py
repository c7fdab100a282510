"""A suspend mid-epoch on Kubernetes: the real master drains, and resumes at the checkpoint.

The operator's part of a suspend (docs/kubernetes.md, "spec.suspend") is played here
as it acts: it asks on the master Deployment (`suspend: "true"`, `resume-from-checkpoint:
pending`); a real `paddlecloud master` process deletes its trainer group (the trainers
drain on SIGTERM) and says it is suspended; then the operator stops it. A master started
again restarts the epoch at the checkpoint before it creates the new group: the tasks
the model never kept (none saved here) are read again, so each record is counted once.
"""

from __future__ import annotations

import asyncio

import grpc
from masters import pb, stub, wait_serving
from test_k8s_deployer import short
from test_k8s_master_process import start_deploying_master

from paddlecloud.backends.k8s import manifests


async def finish_one_task(address: str) -> int:
    """One trainer takes a task and finishes it; the task's id."""
    async with grpc.aio.insecure_channel(address) as channel:
        master = stub(channel)
        registered = await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="t0"))
        reply = await master.GetTask(pb.GetTaskRequest(session_id=registered.session_id,
                                                       epoch=registered.current_epoch))
        assert reply.outcome == pb.TASK, reply
        await master.TaskFinished(pb.TaskReport(session_id=registered.session_id,
                                                task_id=reply.task.id, epoch=reply.task.epoch,
                                                attempt=reply.task.attempt))
        return reply.task.id


async def done_tasks(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        return (await stub(channel).GetStatus(pb.GetStatusRequest())).counts.done


async def test_a_suspend_mid_epoch_is_the_masters_drain_and_the_resume_counts_each_task_once(
        tmp_path, k8s, api_client, kubeconfig, etcd_endpoint, job_name, monkeypatch, start_master):
    from kubernetes import client

    name, ns = short(job_name), "team-r"
    spec, first = await start_deploying_master(tmp_path, api_client, kubeconfig, etcd_endpoint,
                                               monkeypatch, start_master, name=name, namespace=ns,
                                               output=str(tmp_path / "model"))
    await wait_serving(first.address, process=first)
    trainers = manifests.trainer_name(name)
    await k8s.wait_for(lambda: k8s.stored("jobs", ns, trainers), timeout=60, what="the group")
    await finish_one_task(first.address)
    assert await done_tasks(first.address) == 1  # counted done; the model saved nothing

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
    deletes = [r for r in k8s.kmock if r.resource and r.resource.plural == "jobs"
               and str(r.method.value).upper() == "DELETE"]
    assert [r.data["propagationPolicy"] for r in deletes] == ["Foreground"]  # each pod's grace
    assert "suspend requested: draining the trainers" in first.log()
    # then the operator stops it, and a resume starts a master again
    first.stop()
    await asyncio.to_thread(apps.patch_namespaced_deployment, manifests.master_name(name), ns,
                            {"metadata": {"annotations": {manifests.SUSPEND_ANNOTATION: "false"}}})

    # the resume: a master again, which restarts the epoch before it creates the group
    second = start_master("--input", str(tmp_path / "data"), "--namespace", ns, "--deployer",
                          "kubernetes", "--job-spec", str(tmp_path / "job.yaml"), job=name,
                          name="master-2")
    await wait_serving(second.address, process=second)
    await k8s.wait_for(lambda: k8s.stored("jobs", ns, trainers), timeout=60, what="a new group")

    def resumed() -> bool:
        annotations = k8s.stored("deployments", ns, manifests.master_name(name))["metadata"][
            "annotations"]
        return annotations.get(manifests.RESUME_ANNOTATION) == manifests.RESUME_DONE
    await k8s.wait_for(resumed, timeout=30, what="the resume marked done")
    assert master_says(manifests.SUSPENDED_ANNOTATION) == ""
    assert await done_tasks(second.address) == 0  # read again: the model never kept it
    assert "restarted epoch 0" in second.log()
