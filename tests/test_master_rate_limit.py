"""Registrations per token are bounded by a token bucket (`--register-rate`, `--register-burst`):
past it the master answers RESOURCE_EXHAUSTED with a RetryInfo before any etcd work, and the
trainer client waits that long before it registers again (issue 34, finding 4)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from masters import pb, stub, wait_serving
from test_master_auth import job_keys

from master.rate_limit import MIN_RETRY, RateLimited, RegistrationLimit, TokenBucket
from paddlecloud.wire import Reason, error_info


def test_a_bucket_spends_its_burst_then_refills_at_its_rate():
    bucket = TokenBucket(rate=2.0, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(0.5)  # one more token in 1/rate seconds
    assert bucket.take(0.5) == 0.0
    assert bucket.take(100.0) == 0.0 and bucket.tokens == pytest.approx(2.0)  # never past the burst


def test_each_token_has_its_own_bucket_and_a_refusal_says_when_to_retry():
    now = [0.0]
    limit = RegistrationLimit(rate=1.0, burst=2, clock=lambda: now[0])
    limit.admit("trainer")
    limit.admit("trainer")
    with pytest.raises(RateLimited, match="more than 2 at once or 1/s") as refused:
        limit.admit("trainer")
    assert refused.value.retry_after == MIN_RETRY
    limit.admit("operator")  # another token's bucket is full
    now[0] = 1.0
    limit.admit("trainer")


async def test_registrations_past_the_burst_are_shed_with_retry_info(tmp_path, start_master, etcd_endpoint,
                                                                      job_name):
    proc = start_master("--register-rate", "0.5", "--register-burst", "3")
    await wait_serving(proc.address, process=proc)
    async with grpc.aio.insecure_channel(proc.address) as channel:
        m = stub(channel)
        for i in range(3):
            await m.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id=f"t{i}"))
        before = await job_keys(etcd_endpoint, job_name)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await m.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="t3"))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--register-burst" in refused.value.details()
        assert error_info(refused.value)[0] is Reason.RATE_LIMITED
        retry = next(error_details_pb2.RetryInfo.FromString(d.value)
                     for d in rpc_status.from_call(refused.value).details
                     if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR))
        assert retry.retry_delay.ToNanoseconds() >= MIN_RETRY * 1e9
        assert await job_keys(etcd_endpoint, job_name) == before  # refused before any etcd work


def test_the_trainer_client_waits_the_retry_delay_then_registers(start_master, job_name):
    from paddlecloud.master_client.discovery import MasterLocator
    from trainer_agent.client import MasterConnection

    proc = start_master("--register-rate", "0.5", "--register-burst", "1", metrics=True)
    asyncio.run(wait_serving(proc.address, process=proc))
    connection = MasterConnection(MasterLocator(master_endpoint=proc.address), deadline=60)
    try:
        connection.register_trainer("first")
        started = time.monotonic()
        reply = connection.register_trainer("second")  # refused first: the bucket refills in 2 s
        took = time.monotonic() - started
        assert reply.session_id
        assert took >= 0.5 * MIN_RETRY, took  # it waited (the delay jittered x U(0.5, 1.5))
    finally:
        connection.close()
    shed = _metric(proc, 'paddlecloud_master_rate_limited_calls_total{method="RegisterTrainer"}')
    assert 1 <= shed <= 3, shed  # a few waits, no hot loop


def _metric(proc, name: str) -> float:
    import urllib.request

    url = f"http://127.0.0.1:{proc.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))
