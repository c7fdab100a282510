"""`scale_job` (the autoscaler's resize through a job's master) retries a master it cannot
reach: a scale sent before the master listens succeeds once it does. The master is a real
`paddlecloud master` process on the real etcd, started when the first attempt has failed
(from the warning `scale_job` logs about it, before it waits to retry): no timing involved."""

from __future__ import annotations

import asyncio
import logging

import grpc
from masters import stub, wait_serving

from autoscaler.controller import Settings, scale_job
from paddlecloud.api import pb
from paddlecloud.etcd_server import free_port

SETTINGS = Settings(rpc_timeout_s=5.0, attempts=3, retry_wait_s=0.01)


class OnFirstFailure(logging.Handler):
    """Runs `action` (once) when `scale_job` logs its first failed attempt."""

    def __init__(self, action) -> None:
        super().__init__(level=logging.WARNING)
        self.action, self.failures = action, []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if " failed (attempt " not in message:
            return
        self.failures.append(message)
        if len(self.failures) == 1:
            self.action()


async def _desired(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        return (await stub(channel).GetStatus(pb.GetStatusRequest(), timeout=5)).desired_trainers


def test_a_scale_sent_before_the_master_listens_succeeds_once_it_does(start_master, monkeypatch):
    monkeypatch.delenv("PADDLE_JOB_TOKEN_FILE", raising=False)  # the master runs without tokens
    port = free_port()
    address = f"127.0.0.1:{port}"
    started = []

    def start() -> None:
        master = start_master("--trainers", "2", "--min-trainers", "1", "--max-trainers", "4", port=port)
        asyncio.run(wait_serving(master.address, process=master))
        started.append(master)

    watcher = OnFirstFailure(start)
    logger = logging.getLogger("autoscaler.controller")
    logger.addHandler(watcher)
    try:
        assert scale_job(address, 3, job="local/j", settings=SETTINGS)
    finally:
        logger.removeHandler(watcher)
    assert len(started) == 1  # the first attempt found nobody listening
    (failure,) = watcher.failures  # one failed attempt, then the retry succeeded
    assert failure.startswith("job local/j: scale to 3 failed (attempt 1/3): StatusCode.UNAVAILABLE")
    assert asyncio.run(_desired(address)) == 3  # the retry reached the master and it took the size


def test_a_master_that_never_listens_is_given_up_after_the_attempts(caplog):
    address = f"127.0.0.1:{free_port()}"
    assert not scale_job(address, 3, job="local/j", settings=SETTINGS)
    failures = [r.getMessage() for r in caplog.records if " failed (attempt " in r.getMessage()]
    assert [m.split(": ", 1)[1].split(")")[0] for m in failures] == [
        f"scale to 3 failed (attempt {n}/3" for n in (1, 2, 3)]
