"""Helpers to run real master processes in tests and talk to them over real gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from waiting import wait_for, wait_until

from paddlecloud.api import pb, pb_grpc
from paddlecloud.etcd_server import free_port
from paddlecloud.wire import seconds


class MasterProcess:
    """`paddlecloud master` as a child process, with its log in `log_path`."""

    def __init__(self, *, job: str, etcd: str, tmp: Path, args: tuple[str, ...] = (),
                 name: str = "master", port: int | None = None, metrics: bool = False) -> None:
        self.job = job
        self.etcd = etcd
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        # `metrics`: serve /metrics (and the status page) on a free port of its own
        self.metrics_port = free_port() if metrics else None
        self.args = (*args, "--metrics-port", str(self.metrics_port)) if metrics else args
        self.log_path = tmp / f"{name}-{self.port}.log"
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "paddlecloud", "master", "--job", self.job,
                "--etcd-endpoints", self.etcd, "--port", str(self.port), "--host", "127.0.0.1",
                "--advertise", self.address, *self.args]

    def start(self) -> MasterProcess:
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                        env=dict(os.environ, PYTHONUNBUFFERED="1"))
        log.close()
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.process:
            self.process.wait(timeout=30)

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
        return self.process.returncode


async def wait_serving(address: str, *, timeout: float = 30.0, process: MasterProcess | None = None) -> None:
    """Waits until the gRPC health check at `address` answers SERVING."""
    async with grpc.aio.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)

        async def serving() -> bool:
            if process is not None and process.process.poll() is not None:
                raise AssertionError(f"master exited with {process.process.returncode}:\n{process.log()}")
            try:
                reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
            except grpc.aio.AioRpcError:
                return False
            return reply.status == health_pb2.HealthCheckResponse.SERVING

        await wait_for(serving, timeout=timeout, message=f"master at {address} not serving",
                       details=process.log if process else None)


def metric(port: int, name: str) -> float:
    """One sample of a master's Prometheus metrics on `port` (0 when it is not there yet)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.rpartition(" ")[2])
    return 0.0


def stub(channel: grpc.aio.Channel) -> pb_grpc.MasterStub:
    return pb_grpc.MasterStub(channel)



async def read_to_the_end(master: pb_grpc.MasterStub, *, trainer_id: str = "t") -> list[int]:
    """One trainer reads every task left of the job (to JOB_DONE), epoch after epoch,
    acknowledging each; the ids it was dealt. A WAIT (an epoch's end being written) is
    waited out as told."""
    registered = await master.RegisterTrainer(pb.RegisterTrainerRequest(trainer_id=trainer_id))
    session, epoch = registered.session_id, registered.current_epoch
    dealt: list[int] = []
    while True:
        reply = await master.GetTask(pb.GetTaskRequest(session_id=session, epoch=epoch))
        if reply.outcome == pb.JOB_DONE:
            return dealt
        if reply.outcome == pb.EPOCH_DONE:
            epoch = reply.current_epoch
            continue
        if reply.outcome == pb.WAIT:
            await asyncio.sleep(seconds(reply.retry_after))
            continue
        assert reply.outcome == pb.TASK, reply
        dealt.append(reply.task.id)
        await master.TaskFinished(pb.TaskReport(session_id=session, task_id=reply.task.id,
                                                epoch=reply.task.epoch, attempt=reply.task.attempt))

@contextlib.asynccontextmanager
async def serving_stub(start_master, data: Path, *, files: int, records_per_file: int):
    """A master started on `files` files of records written under `data`, once it serves: its stub."""
    from datasets import write_records

    write_records(data, files=files, records_per_file=records_per_file)
    proc = start_master("--input", str(data))
    await wait_serving(proc.address, process=proc)
    async with grpc.aio.insecure_channel(proc.address) as channel:
        yield stub(channel)


def sizing_flags(trainer_size) -> dict:
    """MasterConfig's --trainers/--min-trainers/--max-trainers for (TrainerRange, desired)."""
    if trainer_size is None:
        return {}
    span, desired = trainer_size
    return {"trainers": desired, "min_trainers": span.minimum, "max_trainers": span.maximum}


@contextlib.asynccontextmanager
async def in_process_master(data: Path, etcd_endpoint: str, job_name: str, *, session_ttl: float = 10,
                            trainer_size=None, chunks_per_task: int = 1):
    """A real Dispatcher on a real etcd behind the real servicer on a real gRPC server, in this
    process, so a test can reach behind the machine's back: (dispatcher, servicer, stub).
    `trainer_size`: the job's (TrainerRange, desired), as the master's flags give it; each
    task is `chunks_per_task` chunks of one byte."""
    from master.config import DatasetSpec, MasterConfig, Policy
    from master.dispatcher import Dispatcher
    from master.servicer import MasterServicer
    from paddlecloud import etcd
    from paddlecloud.keys import JobKeys

    config = MasterConfig(job=job_name, namespace="local", etcd_endpoints=etcd_endpoint,
                          policy=Policy(session_ttl=session_ttl, task_timeout=0),
                          dataset=DatasetSpec(paths=(str(data),), chunk_bytes=1,
                                              chunks_per_task=chunks_per_task),
                          **sizing_flags(trainer_size))
    client = await etcd.connect(etcd_endpoint)
    session = await etcd.Session(client, ttl=10).open()
    leadership = await etcd.Election(session, JobKeys("local", job_name).leader).campaign("me")
    dispatcher = Dispatcher(client=client, config=config, leadership=leadership, advertise="me")
    await dispatcher.start()
    servicer = MasterServicer(dispatcher=lambda: dispatcher, leader_hint=lambda: None)
    server = grpc.aio.server()
    pb_grpc.add_MasterServicer_to_server(servicer, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield dispatcher, servicer, stub(channel)
    finally:
        await server.stop(grace=None)
        await dispatcher.stop()
        await session.close()
        await client.close()


# wait_for and wait_until live in tests/waiting.py; re-exported for the tests that import them here.
__all__ = ["MasterProcess", "wait_serving", "wait_for", "wait_until", "stub", "serving_stub",
           "in_process_master", "pb"]


@contextlib.asynccontextmanager
async def serving_servicer(servicer: pb_grpc.MasterServicer) -> AsyncIterator[str]:
    """`servicer` (a stand-in master) on a real gRPC server on a free port: its address."""
    server = grpc.aio.server()
    pb_grpc.add_MasterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)
