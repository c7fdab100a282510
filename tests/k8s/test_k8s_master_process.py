"""A real `paddlecloud master --deployer kubernetes` process deploying a job into kmock.

The master process reaches the emulated API server through a kubeconfig (the same
path a master outside a cluster takes), and the test plays the pserver agents by
registering their endpoints in the real etcd.
"""

from __future__ import annotations

import grpc
from datasets import write_records
from masters import pb, stub, wait_serving
from test_k8s_deployer import create_master, short

from paddlecloud import etcd
from paddlecloud.jobspec import JobSpec
from paddlecloud.k8s import manifests
from paddlecloud.keys import JobKeys


async def test_master_creates_pservers_then_trainers_once_pservers_register(
        tmp_path, k8s, api_client, kubeconfig, etcd_endpoint, job_name, monkeypatch, start_master):
    name = short(job_name)
    write_records(tmp_path / "data", files=2, records_per_file=2)
    spec = JobSpec(name=name, namespace="team-b", module="ctr.train", trainers=2, pservers=2,
                   inputs=(str(tmp_path / "data"),), etcd_endpoints=etcd_endpoint).validate()
    await create_master(api_client, spec)
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(spec.to_yaml())
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    proc = start_master("--input", str(tmp_path / "data"), "--namespace", "team-b",
                        "--deployer", "kubernetes", "--job-spec", str(spec_file), job=name)
    await wait_serving(proc.address, process=proc)
    await k8s.wait_for(lambda: k8s.stored("statefulsets", "team-b", manifests.pserver_name(name)),
                       timeout=30, what="the pserver StatefulSet")
    async with grpc.aio.insecure_channel(proc.address) as channel:
        master = stub(channel)
        assert (await master.GetStatus(pb.GetStatusRequest())).phase == "Starting"
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
