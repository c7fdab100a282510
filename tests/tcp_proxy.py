"""A TCP forwarder in front of a real server, so a test can drop its clients' connections
(`pause`: open ones cut, new ones refused) and let them back (`resume`), as a network
fault or a restarted server would, without touching the server itself.

What this does NOT do: delay, reorder or corrupt bytes; it forwards them or cuts.
"""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def pause(self) -> None:
        """Refuses new connections and cuts the open ones."""
        self._server.close()
        await self._server.wait_closed()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def resume(self) -> None:
        """Accepts connections again, on the same port."""
        await self.start()

    async def close(self) -> None:
        await self.pause()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._writers.discard(writer)
            writer.transport.abort()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
