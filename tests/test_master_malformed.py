"""Bytes that are no request, sent before and after authentication: a clear status, no traceback,
at most one log line, and no parsing for a caller without a token.

Real master processes over a real gRPC channel; the calls are raw bytes (a generic method with
identity serialisers), as an attacker who reaches the port would send them.
"""

from __future__ import annotations

import os

import grpc
import pytest
from datasets import write_records
from masters import wait_serving

from master.malformed import Throttled
from paddlecloud.auth import JobTokens, auth_metadata

GET_STATUS = "/paddlecloud.master.v1.Master/GetStatus"
TASK_STREAM = "/paddlecloud.master.v1.Master/GetTaskStream"
BIG = 4 * 1024 * 1024 - 1024  # just under gRPC's receive limit: what one call may make a master read


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time, from /proc."""
    fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def code_of(call) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def many_unknown_fields(size: int) -> bytes:
    """A message of about `size` bytes of varint fields no request has (field 1000 = 1): it
    parses, each field kept as an unknown one, so the parse costs in proportion."""
    return bytes([0xC0, 0x3E, 0x01]) * (size // 3)


def raw(channel: grpc.aio.Channel, path: str):
    return channel.unary_unary(path, request_serializer=None, response_deserializer=None)


@pytest.fixture
def data(tmp_path):
    write_records(tmp_path / "data", files=2, records_per_file=2)
    return tmp_path / "data"


async def test_malformed_calls_with_and_without_a_token_log_one_line_and_no_traceback(
        tmp_path, data, start_master):
    tokens = JobTokens.generate()
    tokens.write(tmp_path / "tokens")
    master = start_master("--input", str(data), "--tokens-dir", str(tmp_path / "tokens"))
    await wait_serving(master.address, process=master)
    viewer = auth_metadata(tokens.viewer)
    async with grpc.aio.insecure_channel(master.address) as channel:
        call = raw(channel, GET_STATUS)
        anonymous = [await code_of(call(b"\xff", timeout=10)) for _ in range(100)]
        assert set(anonymous) == {grpc.StatusCode.UNAUTHENTICATED}
        with_token = [await code_of(call(b"\xff", metadata=viewer, timeout=10)) for _ in range(100)]
        assert set(with_token) == {grpc.StatusCode.INVALID_ARGUMENT}
        try:
            await call(b"\xff", metadata=viewer, timeout=10)
        except grpc.aio.AioRpcError as error:
            assert "no GetStatus request" in error.details(), error.details()
        # the master still answers a good call
        assert await code_of(call(b"", metadata=viewer, timeout=10)) == grpc.StatusCode.OK
    log = master.log()
    assert "Traceback" not in log, log[-3000:]
    assert log.count("malformed GetStatus request") == 1, log[-3000:]


async def test_a_big_message_without_a_token_is_refused_unread(tmp_path, data, start_master):
    tokens = JobTokens.generate()
    tokens.write(tmp_path / "tokens")
    master = start_master("--input", str(data), "--tokens-dir", str(tmp_path / "tokens"))
    await wait_serving(master.address, process=master)
    big = many_unknown_fields(BIG)  # a GetStatusRequest that parses, at a cost: 1.4 M fields

    async def cpu_of(calls: int, **kwargs) -> tuple[float, set[grpc.StatusCode]]:
        before = cpu_seconds(master.process.pid)
        codes = {await code_of(call(big, timeout=30, **kwargs)) for _ in range(calls)}
        return cpu_seconds(master.process.pid) - before, codes

    async with grpc.aio.insecure_channel(master.address) as channel:
        call = raw(channel, GET_STATUS)
        await code_of(call(b"", timeout=10))  # the first call's one-time costs are not counted
        # side by side on one master: the same bytes parsed (a viewer's) and refused unread
        parsed, parsed_codes = await cpu_of(20, metadata=auth_metadata(tokens.viewer))
        refused, refused_codes = await cpu_of(20)
    assert parsed_codes == {grpc.StatusCode.OK} and refused_codes == {grpc.StatusCode.UNAUTHENTICATED}
    assert refused < 0.6 * parsed, f"20 refused 4 MiB calls cost the master {refused:.2f}s of CPU, " \
        f"20 parsed ones {parsed:.2f}s: the refused ones were parsed too"
    assert "Traceback" not in master.log()


async def test_a_master_without_tokens_answers_malformed_calls_and_streams_invalid_argument(
        data, start_master):
    master = start_master("--input", str(data))
    await wait_serving(master.address, process=master)
    async with grpc.aio.insecure_channel(master.address) as channel:
        codes = [await code_of(raw(channel, GET_STATUS)(b"\xff", timeout=10)) for _ in range(20)]
        assert set(codes) == {grpc.StatusCode.INVALID_ARGUMENT}
        stream = channel.stream_stream(TASK_STREAM, request_serializer=None, response_deserializer=None)

        async def requests():
            yield b"\xff"

        call = stream(requests(), timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            async for _ in call:
                pass
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value
    log = master.log()
    assert "Traceback" not in log, log[-3000:]
    assert log.count("a malformed ") == 1, log[-3000:]


def test_throttled_logs_once_per_period_and_counts_the_rest(caplog):
    now = [0.0]
    throttle = Throttled(every=60, clock=lambda: now[0])
    with caplog.at_level("WARNING", logger="master.malformed"):
        for _ in range(5):
            throttle.note("bad call")
        now[0] = 61
        throttle.note("bad call")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "and 4 more in the last 61s" in lines[1]
