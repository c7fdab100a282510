"""A real master started again after a suspend restarts the epoch where the checkpoint is.

The operator's part of a suspend (docs/kubernetes.md, "spec.suspend") is played here
as it acts: the master stops, then the trainer group goes, and the master Deployment
is marked `resume-from-checkpoint: pending`. A real `paddlecloud master` process then
starts again, and before it creates the new group its deployer restarts the epoch at
the checkpoint: the tasks the model never kept (none saved here) are read again, so
each record is counted once.
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


async def test_a_master_started_after_a_suspend_restarts_the_epoch_at_the_checkpoint(
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

    # the suspend, as the operator makes it: the master first, then its group
    first.stop()
    await asyncio.to_thread(client.BatchV1Api(api_client).delete_namespaced_job, trainers, ns)
    await asyncio.to_thread(
        client.AppsV1Api(api_client).patch_namespaced_deployment, manifests.master_name(name), ns,
        {"metadata": {"annotations": {manifests.RESUME_ANNOTATION: manifests.RESUME_PENDING}}})

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
    assert await done_tasks(second.address) == 0  # read again: the model never kept it
    assert "restarted epoch 0" in second.log()
