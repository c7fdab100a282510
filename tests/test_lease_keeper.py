"""The lease keeper against a real etcd, its stream cut by a real TCP fault (`tcp_proxy`).

At 10,000 trainers registering at once, etcd ended the keeper's stream ("waiting for the
applied index took too long"); the refreshes queued on it were dropped, and thousands of
new sessions lapsed together. A refresh is idempotent: one etcd has not answered is sent
again on the next stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

import aetcd
import pytest
from tcp_proxy import TcpProxy
from waiting import wait_for

from paddlecloud import etcd

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

