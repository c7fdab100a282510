"""A master restarted in place takes over at once: the leader key names its own address on
its dead predecessor's lease, and, as the only process that can listen there (and in the
network namespace its predecessor announced), it revokes that lease instead of waiting up
to an election TTL. A master that merely advertises another's address (misconfigured), or
one whose predecessor at that address was in another network (two machines advertising
127.0.0.1), revokes nothing.

The election TTL here is 600 s: a master that waited for the lease to lapse would not
serve within any of these waits.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import grpc
import pytest
from datasets import write_records
from grpc_health.v1 import health_pb2, health_pb2_grpc
from masters import pb, stub, wait_serving
from waiting import wait_for

from master.presence import network_id, sole_listener_at
from paddlecloud import etcd
from paddlecloud.etcd_server import free_port
from paddlecloud.keys import JobKeys

LONG_TTL = ("--election-ttl", "600s", "--session-ttl", "1800s")


@pytest.fixture
def data(tmp_path) -> str:
    write_records(tmp_path / "data", files=2, records_per_file=2)
    return str(tmp_path / "data")


async def health_of(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return reply.status


async def test_a_master_restarted_in_place_revokes_its_dead_predecessor_s_lease(data, start_master):
    first = start_master("--input", data, *LONG_TTL)
    await wait_serving(first.address, process=first)
    async with grpc.aio.insecure_channel(first.address) as channel:
        session = (await stub(channel).RegisterTrainer(pb.RegisterTrainerRequest(trainer_id="t"))).session_id
    first.kill()
    again = start_master(*first.args, port=first.port, name="again")
    await wait_serving(again.address, process=again, timeout=60)
    assert "which no live campaigner holds (a dead predecessor's, or an earlier session of this one): " \
           "revoking it" in again.log()
    async with grpc.aio.insecure_channel(again.address) as channel:  # the trainer's session lives on
        reply = await stub(channel).GetTask(pb.GetTaskRequest(session_id=session, epoch=0))
        assert reply.outcome == pb.TASK


async def test_a_master_advertising_another_s_address_revokes_nothing(data, start_master):
    leader = start_master("--input", data, *LONG_TTL)
    await wait_serving(leader.address, process=leader)
    impostor = start_master("--input", data, *LONG_TTL, "--advertise", leader.address, name="impostor")
    await wait_for(lambda: f"standby: the leader is {leader.address}" in impostor.log(), timeout=30)
    assert await health_of(leader.address) == health_pb2.HealthCheckResponse.SERVING
    assert await health_of(impostor.address) == health_pb2.HealthCheckResponse.NOT_SERVING
    assert "revoking" not in impostor.log()


async def test_a_predecessor_at_the_same_address_in_another_network_is_not_revoked(
        data, start_master, etcd_endpoint, job_name):
    first = start_master("--input", data, *LONG_TTL)
    await wait_serving(first.address, process=first)
    first.kill()
    keys = JobKeys("local", job_name)
    client = await etcd.connect(etcd_endpoint)
    try:  # as if the leader had been another machine's master, also advertising 127.0.0.1:P
        leader = await client.get(keys.leader)
        presence = json.loads((await client.get(keys.master(first.address))).value)
        presence["network"] = "another-machine:4026531833"
        await client.put(keys.master(first.address), json.dumps(presence).encode(), lease=leader.lease)
        again = start_master(*first.args, port=first.port, name="again")
        await wait_for(lambda: f"standby: the leader is {first.address}" in again.log(), timeout=30)
        assert await health_of(again.address) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert "revoking" not in again.log()
        assert (await client.get(keys.leader)).lease == leader.lease  # still held
    finally:
        await client.close()


def test_the_network_id_is_the_namespace_s_not_the_process_s():
    child = subprocess.run([sys.executable, "-c", "from master.presence import network_id; print(network_id())"],
                           capture_output=True, text=True, check=True)
    assert network_id() and child.stdout.strip() == network_id()


def test_only_an_ip_of_this_machine_on_the_port_listened_on_is_held_alone():
    port = free_port()
    assert sole_listener_at(f"127.0.0.1:{port}", host="127.0.0.1", port=port)
    assert sole_listener_at(f"127.0.0.1:{port}", host="0.0.0.0", port=port)
    assert not sole_listener_at(f"127.0.0.1:{port + 1}", host="0.0.0.0", port=port)  # another port
    assert not sole_listener_at(f"localhost:{port}", host="0.0.0.0", port=port)  # a name: any machine
    assert not sole_listener_at(f"127.0.0.1:{port}", host="127.0.0.2", port=port)  # not listened on
    assert not sole_listener_at(f"192.0.2.7:{port}", host="0.0.0.0", port=port)  # not this machine's
    assert not sole_listener_at("nonsense", host="0.0.0.0", port=port)


async def test_a_campaign_revokes_only_a_lease_it_was_told_holds_its_own_address(etcd_endpoint, job_name):
    """An earlier session of the same master (its term ended while etcd kept its lease, as an
    etcd restart does) is reclaimed; a lease named to it that holds another address is not."""
    client = await etcd.connect(etcd_endpoint)
    key = JobKeys("local", job_name).leader
    sessions = []
    try:
        async def session() -> etcd.Session:
            sessions.append(await etcd.Session(client, ttl=600).open())
            return sessions[-1]

        old = await session()
        await etcd.Election(old, key).campaign("me:1")
        await old.close(revoke=False)  # abandoned: its lease lives on in etcd, with the key
        new = await session()
        seen: list[str] = []

        def saw(address: str, _term: int) -> None:
            seen.append(address)
        waiting = asyncio.create_task(etcd.Election(new, key).campaign("me:1", on_leader=saw))
        await wait_for(lambda: seen == ["me:1"], timeout=30)  # not told: it waits the lease out
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await etcd.Election(new, key).campaign("me:1", reclaim={old.lease_id})
        assert (await client.get(key)).lease == new.lease_id

        await new.close()  # the key goes with it
        other = await session()
        await etcd.Election(other, key).campaign("other:2")
        mine = await session()
        seen.clear()
        waiting = asyncio.create_task(etcd.Election(mine, key).campaign(
            "me:1", on_leader=saw, reclaim={other.lease_id}))
        await wait_for(lambda: seen == ["other:2"], timeout=30)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert (await client.get(key)).lease == other.lease_id  # another address: not revoked
    finally:
        for s in sessions:
            await s.close()
        await client.close()
