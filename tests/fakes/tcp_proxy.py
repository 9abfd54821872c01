"""A loopback TCP proxy in front of a real server, for injecting network faults.

``refuse()`` closes the listener and every open connection (the next connect is refused);
``cut_next_response(after_bytes)`` lets the response to the next ``/v1/completions`` request
through up to a byte count, then drops the connection mid-stream.
"""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._cut_after: int | None = None
        self.connections = 0
        self.requests: list[bytes] = []  # the head of every request that passed upstream

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.refuse()

    async def refuse(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    def cut_next_response(self, after_bytes: int) -> None:
        self._cut_after = after_bytes

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        armed: list[int] = []  # the cut this connection's next response gets

        async def pipe(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, downstream: bool
        ) -> None:
            sent, limit = 0, None
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(4096):
                    if not downstream and data[:5] in (b"POST ", b"GET /"):
                        self.requests.append(data.split(b"\r\n\r\n", 1)[0])
                    if not downstream and b"POST /v1/completions" in data and self._cut_after:
                        armed.append(self._cut_after)
                        self._cut_after = None
                    if downstream and limit is None and armed:
                        limit, sent = armed.pop(), 0  # counted from this response on
                    if limit is not None and sent + len(data) > limit:
                        dst.write(data[: limit - sent])
                        await dst.drain()
                        dst.transport.abort()
                        up_writer.transport.abort()
                        return
                    sent += len(data)
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer, False), pipe(up_reader, writer, True))
        self._writers.discard(writer)
        self._writers.discard(up_writer)
