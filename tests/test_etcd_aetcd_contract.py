"""What `paddlecloud.etcd.aetcd_client` relies on in aetcd, which has no public API for it (a
TLS channel, a renewed token): these fail when an aetcd release changes one of those
internals, before a client would misbehave. pyproject.toml bounds aetcd to the minor
version checked here."""

from __future__ import annotations

import inspect
from importlib.metadata import version
from pathlib import Path

import aetcd
import pytest
import tomllib
from aetcd import watcher
from packaging.requirements import Requirement

from paddlecloud.etcd import connect
from paddlecloud.etcd.aetcd_client import AuthToken, Client

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.unit
def test_the_installed_aetcd_is_within_the_bound_this_contract_was_checked_for():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    bound = next(Requirement(d) for d in dependencies if Requirement(d).name == "aetcd")
    assert version("aetcd") in bound.specifier
    assert "1.1" not in bound.specifier, "a minor release may change the internals checked here"


@pytest.mark.unit
def test_aetcd_keeps_its_watcher_in_the_attribute_the_client_fills():
    fresh = aetcd.Client()
    assert fresh._watcher is None and fresh.channel is None and fresh.metadata is None
    assert "self._watcher.add_callback" in inspect.getsource(aetcd.Client.watch)
    close = inspect.getsource(aetcd.Client.close)
    assert "self._watcher.shutdown()" in close and "self._init_channel_attrs()" in close


@pytest.mark.unit
def test_aetcd_s_watcher_takes_the_metadata_it_sends_when_a_stream_opens():
    parameters = inspect.signature(watcher.Watcher).parameters
    assert {"watchstub", "timeout", "metadata"} <= set(parameters)
    assert "self._handle_request(self._metadata)" in inspect.getsource(watcher.Watcher.setup)


@pytest.mark.unit
def test_the_token_is_metadata_that_follows_each_renewal():
    token = AuthToken("first")
    sent_before = tuple(token)  # what gRPC copies when a call starts
    token.token = "second"
    assert sent_before == (("token", "first"),)
    assert tuple(token) == (("token", "second"),) and dict(token) == {"token": "second"}
    assert "second" not in repr(token)


async def test_watches_reads_and_a_reconnect_go_through_the_client(etcd_endpoint, job_name):
    client = await connect(etcd_endpoint)
    key = f"/paddlecloud/contract/{job_name}".encode()
    try:
        assert isinstance(client, Client)
        watch = await client.watch(key)
        await client.put(key, b"1")
        async for event in watch:
            assert (event.kind, event.kv.value) == ("PUT", b"1")
            break
        await watch.cancel()
        await client.close()
        assert client.channel is None and client._watcher is None  # aetcd's close reset them
        assert (await client.get(key)).value == b"1"  # and the next call dialled again
    finally:
        await client.close()
