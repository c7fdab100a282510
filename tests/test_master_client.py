"""The one master client (`paddlecloud.master_client`) as its callers other than the trainer
use it: one call from synchronous code (the CLI, the autoscaler), and the asyncio session
(bench/scale.py's trainers), each against a real gRPC server."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from masters import serving_servicer

from paddlecloud.api import pb, pb_grpc
from paddlecloud.auth import ClientCredentials
from paddlecloud.backends.k8s.jobs import fetch_master_status
from paddlecloud.etcd_server import free_port
from paddlecloud.master_client import MasterConnection, MasterLocator, MasterUnavailable, Session
from paddlecloud.wire import Reason, duration, error_status


class AwayAtFirst(pb_grpc.MasterServicer):
    """Answers GetStatus UNAVAILABLE (a master restarting) `away` times, then answers."""

    def __init__(self, away: int) -> None:
        self.away, self.calls = away, 0

    async def GetStatus(self, request, context):
        self.calls += 1
        if self.calls <= self.away:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
        return pb.GetStatusResponse(phase="Running", job="j")


class Expiring(pb_grpc.MasterServicer):
    """Sessions 1, 2, ...; the first one's KeepAlives answer SESSION_EXPIRED."""

    def __init__(self) -> None:
        self.registered = 0

    async def RegisterTrainer(self, request, context):
        self.registered += 1
        return pb.RegisterTrainerResponse(session_id=self.registered, ttl=duration(30))

    async def KeepAlive(self, request, context):
        if request.session_id == 1:
            await context.abort_with_status(error_status(grpc.StatusCode.NOT_FOUND, "expired",
                                                         Reason.SESSION_EXPIRED))
        return pb.KeepAliveResponse(ttl=duration(30))


async def test_one_call_from_synchronous_code_rides_out_a_master_that_is_away():
    servicer = AwayAtFirst(away=2)
    async with serving_servicer(servicer) as address:
        reply = await asyncio.to_thread(fetch_master_status, address, timeout=30)
    assert (reply.phase, servicer.calls) == ("Running", 3)


def test_a_master_that_never_answers_is_unavailable_by_the_timeout_naming_its_address():
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(MasterUnavailable, match=f"master unreachable at {address} for 2s"):
        fetch_master_status(address, timeout=2)


async def test_callers_that_hear_session_expired_together_register_again_once():
    servicer = Expiring()
    async with serving_servicer(servicer) as address:
        connection = MasterConnection(MasterLocator(master_endpoint=address), deadline=30,
                                      credentials=ClientCredentials())
        session = Session(connection, trainer_id="t")
        try:
            await session.register()
            await asyncio.gather(*(session.run(connection.keep_alive) for _ in range(5)))
        finally:
            session.close()
            await connection.close()
    assert (session.id, session.reregistrations, servicer.registered) == (2, 1, 2)
