"""The lease keepers against a real etcd: the in-loop one, its stream cut by a real TCP fault
(`tcp_proxy`), and the master's, in a real process of its own, stopped and killed.

At 10,000 trainers registering at once, etcd ended the keeper's stream ("waiting for the
applied index took too long"); the refreshes queued on it were dropped, and thousands of
new sessions lapsed together. A refresh is idempotent: one etcd has not answered is sent
again on the next stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
from urllib.parse import urlsplit

import aetcd
import pytest
from tcp_proxy import TcpProxy
from waiting import wait_for

from paddlecloud import etcd
from paddlecloud.lease_process import LeaseKeeperProcess

TTL = 20


@pytest.fixture
async def cut_keeper(etcd_endpoint):
    """(keeper through a proxy, the proxy, a direct client, a lease of TTL seconds)."""
    target = urlsplit(etcd_endpoint)
    proxy = await TcpProxy(target.hostname, target.port).start()
    direct = await etcd.connect(etcd_endpoint)
    proxied = await etcd.connect(f"http://127.0.0.1:{proxy.port}")
    keeper = etcd.LeaseKeeper(proxied)
    lease = (await direct.lease(TTL)).id
    try:
        assert await keeper.refresh(lease) == TTL  # the stream is up
        yield keeper, proxy, direct, lease
    finally:
        await keeper.close()
        await proxy.close()
        await proxied.close()
        with contextlib.suppress(aetcd.ClientError):  # lapsed already when a test failed
            await direct.revoke_lease(lease)
        await direct.close()


async def remaining(client, lease: int) -> int:
    return (await client.get_lease_info(lease, keys=False)).TTL


async def test_a_refresh_queued_while_the_stream_is_cut_is_sent_once_it_is_back(cut_keeper):
    keeper, proxy, direct, lease = cut_keeper
    await proxy.pause()
    keeper.refresh_soon(lease)  # as one a trainer's call piggybacks: nobody waits for its answer
    await wait_for(lambda: _below(direct, lease, TTL - 3), timeout=30,
                   message="the lease's TTL never ran down")
    await proxy.resume()
    await wait_for(lambda: _above(direct, lease, TTL - 3), timeout=30,
                   message="etcd never got the refresh queued while the stream was cut")


async def test_a_waited_refresh_outlasts_a_cut_stream(cut_keeper):
    keeper, proxy, direct, lease = cut_keeper
    await proxy.pause()
    waited = asyncio.create_task(keeper.refresh(lease, timeout=60))
    await wait_for(lambda: _below(direct, lease, TTL - 3), timeout=30,
                   message="the lease's TTL never ran down")
    assert not waited.done(), f"the refresh ended while etcd was cut off: {waited}"
    await proxy.resume()
    assert await asyncio.wait_for(waited, 60) > TTL - 3


async def test_a_refresh_still_gives_up_after_its_timeout(cut_keeper):
    keeper, proxy, _, lease = cut_keeper
    await proxy.pause()
    with pytest.raises(etcd.EtcdUnavailable, match=f"lease {lease:x} in 1s"):
        await keeper.refresh(lease, timeout=1)


async def _below(client, lease: int, ttl: int) -> bool:
    return await remaining(client, lease) < ttl


async def _above(client, lease: int, ttl: int) -> bool:
    return await remaining(client, lease) > ttl


# ---- in a process of its own (the master's) -------------------------------------------


@pytest.fixture
async def process_keeper(etcd_endpoint):
    """(a LeaseKeeperProcess, a direct client, a lease of TTL seconds)."""
    direct = await etcd.connect(etcd_endpoint)
    keeper = LeaseKeeperProcess(etcd_endpoint)
    lease = (await direct.lease(TTL)).id
    try:
        yield keeper, direct, lease
    finally:
        await keeper.close()
        with contextlib.suppress(aetcd.ClientError):
            await direct.revoke_lease(lease)
        await direct.close()


async def test_the_process_keeper_refreshes_leases_and_says_which_are_gone(process_keeper):
    keeper, direct, lease = process_keeper
    gone = (await direct.lease(TTL)).id
    await direct.revoke_lease(gone)
    assert await keeper.refresh(lease) == TTL
    assert await keeper.refresh(gone) == 0
    child = keeper.child
    await keeper.close()
    assert child.returncode == 0, "the lease process outlived its keeper"


async def test_a_killed_lease_process_is_started_again_and_asked_again(process_keeper):
    """A refresh the child took and never answered (it is stopped, then killed) is asked of
    the next child."""
    keeper, direct, lease = process_keeper
    assert await keeper.refresh(lease) == TTL
    first = keeper.child
    first.send_signal(signal.SIGSTOP)
    keeper.refresh_soon(lease)
    await wait_for(lambda: _below(direct, lease, TTL - 3), timeout=30,
                   message="the lease's TTL never ran down")
    first.kill()
    await wait_for(lambda: _above(direct, lease, TTL - 3), timeout=30,
                   message="the refresh the dead process had taken was never asked again")
    assert keeper.child is not first and keeper.child.poll() is None


async def test_a_sigterm_or_ctrl_c_to_the_process_group_leaves_the_lease_process_to_its_parent(
        process_keeper):
    """They reach the master's children too. The master stops on them and then closes the
    child's stdin; a child that died of them first was restarted, with a warning, at the end
    of every local job."""
    keeper, _, lease = process_keeper
    assert await keeper.refresh(lease) == TTL  # the child runs: its signal handling is set
    child = keeper.child
    child.send_signal(signal.SIGTERM)
    child.send_signal(signal.SIGINT)
    assert await keeper.refresh(lease) == TTL
    await keeper.close()
    assert child.returncode == 0, "the lease process died of the signal, not at its stdin's end"


def lease_process(settings: dict) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-m", "paddlecloud.lease_process"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdin.write(json.dumps(settings).encode() + b"\n")
    child.stdin.flush()
    return child


def test_the_lease_process_ends_when_its_parent_does(etcd_endpoint):
    """Its stdin closes when the master stops or is killed: it must not outlive it."""
    child = lease_process({"endpoints": etcd_endpoint, "timeout": 10, "credentials": {}})
    child.stdin.close()
    assert child.wait(timeout=30) == 0, child.stderr.read().decode()


def test_the_lease_process_names_an_etcd_it_cannot_reach():
    child = lease_process({"endpoints": "http://127.0.0.1:1", "timeout": 1, "credentials": {}})
    _, err = child.communicate(timeout=60)
    assert child.returncode == 1 and "127.0.0.1:1" in err.decode(), err.decode()
