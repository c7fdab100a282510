"""A real `paddlecloud master --deployer kubernetes` process deploying a job into kmock.

The master process reaches the emulated API server through a kubeconfig (the same
path a master outside a cluster takes), and the test plays the pserver agents by
registering their endpoints in the real etcd.
"""

from __future__ import annotations

import grpc
from datasets import write_records
from masters import pb, read_to_the_end, stub, wait_serving
from test_k8s_deployer import create_master, short

from master.goodput import CAUSES
from paddlecloud import etcd
from paddlecloud.backends.k8s import manifests
from paddlecloud.jobspec import JobSpec
from paddlecloud.keys import JobKeys


async def start_deploying_master(tmp_path, api_client, kubeconfig, etcd_endpoint, monkeypatch,
                                 start_master, *, name: str, namespace: str,
                                 pservers: int = 0, **changes) -> tuple[JobSpec, object]:
    """What `job submit` makes (the master Deployment, the spec), and a real master deploying."""
    write_records(tmp_path / "data", files=2, records_per_file=2)
    spec = JobSpec(name=name, namespace=namespace, module="ctr.train", trainers=2,
                   pservers=pservers, inputs=(str(tmp_path / "data"),),
                   etcd_endpoints=etcd_endpoint, **changes).validate()
    await create_master(api_client, spec)
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(spec.to_yaml())
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    proc = start_master("--input", str(tmp_path / "data"), "--namespace", namespace,
                        "--deployer", "kubernetes", "--job-spec", str(spec_file), job=name)
    return spec, proc


async def test_master_creates_pservers_then_trainers_once_pservers_register(
        tmp_path, k8s, api_client, kubeconfig, etcd_endpoint, job_name, monkeypatch, start_master):
    name = short(job_name)
    spec, proc = await start_deploying_master(tmp_path, api_client, kubeconfig, etcd_endpoint,
                                              monkeypatch, start_master, name=name,
                                              namespace="team-b", pservers=2)
    await wait_serving(proc.address, process=proc)
    await k8s.wait_for(lambda: k8s.stored("statefulsets", "team-b", manifests.pserver_name(name)),
                       timeout=30, what="the pserver StatefulSet")
    async with grpc.aio.insecure_channel(proc.address) as channel:
        master = stub(channel)

        async def starting() -> bool:  # the deployment's phase follows the objects it made
            return (await master.GetStatus(pb.GetStatusRequest())).phase == "Starting"
        await k8s.wait_for(starting, timeout=30, what="phase Starting")
        # No trainer before every pserver registered.
        assert k8s.stored("jobs", "team-b", manifests.trainer_name(name)) is None
        client = await etcd.connect(etcd_endpoint)
        keys = JobKeys("team-b", name)
        try:
            for index, endpoint in enumerate(manifests.pserver_endpoints(spec)):
                assert k8s.stored("jobs", "team-b", manifests.trainer_name(name)) is None
                await client.put(keys.pserver(index), endpoint.encode())
        finally:
            await client.close()
        await k8s.wait_for(lambda: k8s.stored("jobs", "team-b", manifests.trainer_name(name)),
                           timeout=30, what="the trainers' Indexed Job")
        trainers = k8s.stored("jobs", "team-b", manifests.trainer_name(name))
        assert trainers["spec"]["completionMode"] == "Indexed"
        owner = trainers["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("Deployment", manifests.master_name(name))

        async def running():
            return (await master.GetStatus(pb.GetStatusRequest())).phase == "Running"
        await k8s.wait_for(running, timeout=30, what="phase Running")
        status = await master.GetStatus(pb.GetStatusRequest())
        assert list(status.pserver_endpoints) == manifests.pserver_endpoints(spec)
        # the epoch is shown on the master Deployment, for readers with no route to the master
        deployment = manifests.master_name(name)
        await k8s.wait_for(lambda: (k8s.stored("deployments", "team-b", deployment)["metadata"]
                                    .get("annotations") or {}).get(manifests.EPOCH_ANNOTATION)
                           == f"{status.current_epoch}/{status.num_epochs}",
                           timeout=30, what="the epoch annotation on the master Deployment")
        # and the job's goodput figures, every cause the master counts (the PaddleJob's status)
        def goodput_shown() -> str:
            return (k8s.stored("deployments", "team-b", deployment)["metadata"].get("annotations")
                    or {}).get(manifests.GOODPUT_ANNOTATION, "")
        await k8s.wait_for(goodput_shown, timeout=30, what="the goodput annotation")
        assert {part.partition("=")[0] for part in goodput_shown().split(",")} == set(CAUSES)



async def test_a_permanent_deploy_error_fails_the_job_with_its_reason(
        tmp_path, k8s, api_client, kubeconfig, etcd_endpoint, job_name, monkeypatch, start_master):
    name = short(job_name)
    k8s.fail("patch", "jobs", status=403, times=1000,
             message='jobs.batch is forbidden: cannot create resource "jobs"')
    spec, proc = await start_deploying_master(tmp_path, api_client, kubeconfig, etcd_endpoint,
                                              monkeypatch, start_master, name=name,
                                              namespace="team-c")
    await wait_serving(proc.address, process=proc)

    def annotations() -> dict:
        deployment = k8s.stored("deployments", "team-c", manifests.master_name(name))
        return deployment["metadata"].get("annotations") or {}
    await k8s.wait_for(lambda: annotations().get(manifests.PHASE_ANNOTATION) == "Failed",
                       timeout=30, what="phase Failed on the master Deployment")
    client = await etcd.connect(etcd_endpoint)
    try:
        assert (await client.get(JobKeys("team-c", name).phase)).value == b"Failed"
    finally:
        await client.close()
    assert "forbidden to apply jobs" in annotations()[manifests.PHASE_REASON_ANNOTATION]
    assert k8s.posted().count(("jobs", manifests.trainer_name(name))) == 1  # not retried
    # the leader stays: it reports the failure, no other master would do better
    async with grpc.aio.insecure_channel(proc.address) as channel:
        assert (await stub(channel).GetStatus(pb.GetStatusRequest())).phase == "Failed"
    assert "stepping down" not in proc.log()


async def test_a_transient_deploy_error_past_its_retries_steps_the_master_down(
        tmp_path, k8s, api_client, kubeconfig, etcd_endpoint, job_name, monkeypatch, start_master):
    name = short(job_name)
    # The deployer's read of the trainer Job (before it applies one) fails for one whole
    # round of retries (5 tries), then the API server recovers.
    answered = k8s.fail("get", "jobs", status=503, times=5, message="etcdserver: timeout")
    spec, proc = await start_deploying_master(tmp_path, api_client, kubeconfig, etcd_endpoint,
                                              monkeypatch, start_master, name=name,
                                              namespace="team-c")
    await k8s.wait_for(lambda: k8s.stored("jobs", "team-c", manifests.trainer_name(name)),
                       timeout=90, what="the trainers, deployed by the next term")
    assert answered == [5]
    log = proc.log()
    assert "deploying failed for now" in log and "stepping down" in log
    assert log.count("elected leader") >= 2  # stepped down, then elected again
    client = await etcd.connect(etcd_endpoint)
    try:
        value = await client.get(JobKeys("team-c", name).phase)
    finally:
        await client.close()
    assert value is not None and value.value != b"Failed"


async def test_a_new_leader_after_the_data_s_end_leaves_the_running_trainers_alone(
        tmp_path, k8s, api_client, kubeconfig, etcd_endpoint, job_name, monkeypatch, start_master):
    """The data's end is not the job's: trainers still run (saving the model) until they exit
    or the done grace passes. A failover in between must not take the end as a verdict."""
    name, ns = short(job_name), "team-d"
    spec, proc = await start_deploying_master(tmp_path, api_client, kubeconfig, etcd_endpoint,
                                              monkeypatch, start_master, name=name, namespace=ns)
    await wait_serving(proc.address, process=proc)
    trainers = manifests.trainer_name(name)
    await k8s.wait_for(lambda: k8s.stored("jobs", ns, trainers), timeout=30, what="the trainers' Job")
    k8s.set_job_status(ns, trainers, {"active": 2})  # both still running after the last task
    async with grpc.aio.insecure_channel(proc.address) as channel:
        await read_to_the_end(stub(channel), trainer_id="0")

    def deployment() -> dict:
        return k8s.stored("deployments", ns, manifests.master_name(name))
    await k8s.wait_for(lambda: deployment()["metadata"]["annotations"].get(manifests.EPOCH_ANNOTATION)
                       == "1/1", timeout=30, what="the data's end shown by the first leader")
    proc.kill()
    # the new leader's first look at the job shows the epoch again: its watch has begun
    deployment()["metadata"]["annotations"][manifests.EPOCH_ANNOTATION] = "unseen"
    later = start_master(*proc.args, job=name, name="later")
    await k8s.wait_for(lambda: deployment()["metadata"]["annotations"].get(manifests.EPOCH_ANNOTATION)
                       == "1/1", timeout=60, what="the new leader watching the job")
    assert k8s.stored("jobs", ns, trainers) is not None  # not cleaned up as if Succeeded
    assert "repeating its clean-up only" not in later.log()
    assert deployment()["metadata"]["annotations"][manifests.PHASE_ANNOTATION] == "Running"
