"""The master's HTTP port against hostile clients (issue 34, finding 6): half-sent requests
(slowloris) are closed within a bound, a malformed URL is one log line, and every answer
carries the security headers. The page itself still works under its CSP:
test_status_page_browser.py runs it in chromium."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from waiting import wait_for

from master.web import MAX_CONNECTIONS, SECURITY_HEADERS, StatusPage


async def _page(**kwargs) -> StatusPage:
    page = StatusPage(job="j", namespace="local", advertise="a:1", dispatcher=lambda: None,
                      leader_hint=lambda: "b:2", **kwargs)
    await page.start(host="127.0.0.1", port=0)
    return page


async def _half_sent(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that sends part of a request's headers and then nothing (kept open: the
    writer is returned, since a collected StreamWriter closes its connection)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /api/job HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # never the end of the headers
    await writer.drain()
    return reader, writer


def _closed(reader: asyncio.StreamReader) -> bool:
    """The server closed it: an end of file, or a reset (a socket closed with the request unread
    sends RST)."""
    return reader.exception() is not None or reader.at_eof()


async def _until_closed(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.read()
    except ConnectionResetError:
        return b""


async def test_300_half_sent_requests_are_closed_within_the_idle_timeout():
    idle = 2.0
    page = await _page(idle_timeout=idle)
    try:
        connections = await asyncio.gather(*(_half_sent(page.port) for _ in range(300)))
        closed = await asyncio.wait_for(asyncio.gather(*(_until_closed(r) for r, _ in connections)), idle + 30)
        assert all(data == b"" for data in closed)  # closed by the server, nothing answered
        for _, writer in connections:
            writer.close()
        assert MAX_CONNECTIONS < 300  # some were refused as they opened, the rest timed out
        async with aiohttp.ClientSession() as session, session.get(
                f"http://127.0.0.1:{page.port}/api/job") as reply:
            assert reply.status == 200  # the port still serves
    finally:
        await page.stop()


async def test_a_malformed_url_is_one_log_line_without_a_traceback(caplog):
    page = await _page()
    try:
        with caplog.at_level(logging.INFO):
            reader, writer = await asyncio.open_connection("127.0.0.1", page.port)
            writer.write(b"GET /\x01bad HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await reader.read()
            writer.close()
            assert answer.startswith(b"HTTP/1.0 400")

            def logged() -> list[logging.LogRecord]:
                return [r for r in caplog.records if "bad HTTP request" in r.getMessage()]
            records = await wait_for(logged, timeout=30)
        assert len(records) == 1 and records[0].exc_info is None and "\n" not in records[0].getMessage()
        assert not any(r.exc_info for r in caplog.records)
    finally:
        await page.stop()


async def test_every_answer_carries_the_security_headers():
    page = await _page()
    try:
        async with aiohttp.ClientSession() as session:
            for path, status in (("/", 200), ("/api/job", 200), ("/static/page.js", 200), ("/nowhere", 404)):
                async with session.get(f"http://127.0.0.1:{page.port}{path}") as reply:
                    assert reply.status == status, path
                    for name, value in SECURITY_HEADERS.items():
                        assert reply.headers.get(name) == value, (path, name)
        assert "frame-ancestors 'none'" in SECURITY_HEADERS["Content-Security-Policy"]
        assert SECURITY_HEADERS["X-Frame-Options"] == "DENY"
        assert SECURITY_HEADERS["X-Content-Type-Options"] == "nosniff"
    finally:
        await page.stop()


async def test_connections_past_the_limit_are_closed_as_they_open():
    page = await _page(idle_timeout=600)  # the idle timeout closes none of them in this test
    try:
        connections = await asyncio.gather(*(_half_sent(page.port) for _ in range(MAX_CONNECTIONS + 20)))

        def refused() -> int | None:
            count = sum(_closed(reader) for reader, _ in connections)
            return count if count >= 20 else None

        async def read_what_came() -> int | None:
            await asyncio.sleep(0)  # let the readers take in the EOFs that arrived
            return refused()
        assert await wait_for(read_what_came, timeout=30) == 20
        for _, writer in connections:
            writer.close()
    finally:
        await page.stop()
