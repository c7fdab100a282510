"""The autoscaler calls masters over TLS, trusting the CA each job publishes on its master
Deployment (`paddlecloud.org/master-ca`): the only place a cluster-wide controller can read
it without any right on Secrets. Real gRPC with TLS, the API through kmock."""

from __future__ import annotations

import base64
from typing import Any

import grpc
import pytest

from autoscaler.controller import Controller, Settings, scale_job
from paddlecloud.api import pb, pb_grpc
from paddlecloud.backends.k8s import manifests
from paddlecloud.backends.k8s.jobs import create_job
from paddlecloud.jobspec import JobSpec
from paddlecloud.tls import issue_master_certificate

NS = "ml"
SETTINGS = Settings(rpc_timeout_s=2.0, attempts=1, retry_wait_s=0.01)


class RangeMaster(pb_grpc.MasterServicer):
    """GetStatus and ScaleTrainers only, over TLS with a given certificate."""

    def __init__(self) -> None:
        self.scaled: list[int] = []

    async def GetStatus(self, request: Any, context: Any) -> Any:
        return pb.GetStatusResponse(min_trainers=1, max_trainers=4, desired_trainers=2)

    async def ScaleTrainers(self, request: Any, context: Any) -> Any:
        self.scaled.append(request.trainers)
        return pb.ScaleTrainersResponse(min_trainers=1, max_trainers=4, desired_trainers=request.trainers)


@pytest.fixture
async def tls_masters(k8s: Any, api_client: Any):
    """Submits jobs (create_job: the certificate issued, the CA published) and serves each
    job's certificate from a RangeMaster; yields {job: (address, servicer)}."""
    servers, found = [], {}

    async def start(name: str, *, key_pair: tuple[bytes, bytes] | None = None) -> RangeMaster:
        import asyncio

        spec = JobSpec(name=name, namespace=NS, module="m", trainers=2, min_trainers=1, max_trainers=4)
        await asyncio.to_thread(create_job, api_client, spec=spec,
                                objects=manifests.submit_objects(spec))
        data = k8s.stored("secrets", NS, manifests.tokens_secret_name(name))["data"]
        pair = key_pair or (base64.b64decode(data["tls.key"]), base64.b64decode(data["tls.crt"]))
        servicer = RangeMaster()
        server = grpc.aio.server()
        pb_grpc.add_MasterServicer_to_server(servicer, server)
        found[name] = f"127.0.0.1:{server.add_secure_port('127.0.0.1:0', grpc.ssl_server_credentials([pair]))}"
        await server.start()
        servers.append(server)
        return servicer

    yield start, found
    for server in servers:
        await server.stop(None)


async def test_the_autoscaler_reads_and_scales_masters_trusting_the_published_ca(k8s, api_client, tls_masters):
    import asyncio

    start, address = tls_masters
    good = await start("good")
    # a master whose certificate the job's CA did not sign (an impostor on its address)
    other = issue_master_certificate(manifests.master_certificate_hosts("bad", NS), job="other")
    await start("bad", key_pair=(other.key, other.cert))
    controller = Controller(api_client, settings=SETTINGS, master_address=lambda name, ns: address[name])
    _, deployments = await asyncio.to_thread(controller.snapshot)
    assert set(deployments) == {f"{NS}/good"}  # the impostor's answer is never read
    ca = base64.b64decode(k8s.stored("secrets", NS, "good-tokens")["data"]["ca.crt"])
    published = deployments[f"{NS}/good"]["metadata"]["annotations"][manifests.MASTER_CA_ANNOTATION]
    assert published.encode() == ca
    assert await asyncio.to_thread(scale_job, address["good"], 3, job="ml/good", settings=SETTINGS, ca=ca)
    assert good.scaled == [3]
    # without the CA the same call cannot even reach it (TLS), so nothing is scaled
    assert not await asyncio.to_thread(scale_job, address["good"], 4, job="ml/good", settings=SETTINGS)
    assert good.scaled == [3]
