"""The master's trainer range: kept in etcd, shown by GetStatus and metrics, changed by ScaleTrainers."""

from __future__ import annotations

import asyncio
import urllib.request

import grpc
import pytest
from masters import stub, wait_serving

from paddlecloud import etcd
from paddlecloud.api import pb
from paddlecloud.etcd_server import free_port
from paddlecloud.keys import JobKeys


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
        return page.read().decode()


async def _etcd_value(endpoint: str, key: bytes) -> bytes | None:
    client = await etcd.connect(endpoint)
    try:
        found = await client.get(key)
        return found.value if found is not None else None
    finally:
        await client.close()


async def test_scale_within_the_range_is_kept_in_etcd_and_survives_a_new_master(
        start_master, etcd_endpoint, job_name):
    keys = JobKeys("local", job_name)
    metrics_port = free_port()
    first = start_master("--trainers", "2", "--min-trainers", "1", "--max-trainers", "4",
                         "--metrics-port", str(metrics_port))
    await wait_serving(first.address, process=first)
    async with grpc.aio.insecure_channel(first.address) as channel:
        status = await stub(channel).GetStatus(pb.GetStatusRequest())
        assert (status.min_trainers, status.max_trainers, status.desired_trainers) == (1, 4, 2)
        reply = await stub(channel).ScaleTrainers(pb.ScaleTrainersRequest(trainers=3))
        assert (reply.min_trainers, reply.max_trainers, reply.desired_trainers) == (1, 4, 3)
        for bad in (0, 5):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub(channel).ScaleTrainers(pb.ScaleTrainersRequest(trainers=bad))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"{bad} trainers is outside the job's range 1..4" in refused.value.details()
        assert (await stub(channel).GetStatus(pb.GetStatusRequest())).desired_trainers == 3
    text = await asyncio.to_thread(_scrape, metrics_port)
    assert "paddlecloud_master_trainers_desired 3.0" in text
    assert "paddlecloud_master_trainers_min 1.0" in text and "paddlecloud_master_trainers_max 4.0" in text
    assert await _etcd_value(etcd_endpoint, keys.trainers_desired) == b"3"
    assert await _etcd_value(etcd_endpoint, keys.trainers_range) == b'{"min": 1, "max": 4}'

    # a master started later with other flags: etcd's range and desired size stand
    first.stop()
    second = start_master("--trainers", "2")
    await wait_serving(second.address, process=second)
    async with grpc.aio.insecure_channel(second.address) as channel:
        status = await stub(channel).GetStatus(pb.GetStatusRequest())
    assert (status.min_trainers, status.max_trainers, status.desired_trainers) == (1, 4, 3)


async def test_a_master_without_a_range_refuses_to_scale(start_master, job_name):
    master = start_master()
    await wait_serving(master.address, process=master)
    async with grpc.aio.insecure_channel(master.address) as channel:
        assert (await stub(channel).GetStatus(pb.GetStatusRequest())).desired_trainers == 0
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub(channel).ScaleTrainers(pb.ScaleTrainersRequest(trainers=2))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no trainer range" in refused.value.details()


def test_a_bad_range_is_a_usage_error_naming_it(start_master):
    master = start_master("--trainers", "5", "--max-trainers", "4")
    assert master.process.wait(timeout=60) == 2
    assert "5 trainers is outside the job's range" in master.log()
