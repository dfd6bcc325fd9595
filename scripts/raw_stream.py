"""One HTTP/1.1 request on its own socket, read as raw bytes, closed at a moment and in a way
the caller picks (a plain close, or a TCP RST via SO_LINGER 0): the misbehaving client of
chaos.py."""

from __future__ import annotations

import json
import socket
import struct

import trio


class RawStream:
    """`status` and `events` (SSE data lines) are what has been read so far."""

    def __init__(self, host: str, port: int, api_key: str | None) -> None:
        self.host, self.port, self.api_key = host, port, api_key
        self.stream: trio.SocketStream | None = None
        self.status: int | None = None
        self.events = 0  # SSE data lines seen
        self.eof = False
        self._buf = b""

    def request_bytes(self, path: str, body: dict) -> tuple[bytes, bytes]:
        payload = json.dumps(body).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                f"Content-Length: {len(payload)}\r\n")
        if self.api_key:
            head += f"Authorization: Bearer {self.api_key}\r\n"
        return (head + "\r\n").encode(), payload

    async def connect(self) -> None:
        self.stream = await trio.open_tcp_stream(self.host, self.port)

    async def send(self, data: bytes) -> None:
        assert self.stream is not None
        await self.stream.send_all(data)

    async def read_some(self) -> None:
        assert self.stream is not None
        data = await self.stream.receive_some(65536)
        if not data:
            self.eof = True
            return
        self._buf += data
        if self.status is None and b"\r\n" in self._buf:
            try:
                self.status = int(self._buf.split(b" ", 2)[1])
            except (IndexError, ValueError):
                self.status = -1
        self.events += data.count(b"data: ")
        if self.status not in (None, 200) and b"\r\n\r\n" in self._buf:
            self.eof = True  # an error answer: nothing will stream on this request

    async def read_until(self, events: int) -> None:
        while self.events < events and not self.eof:
            await self.read_some()

    async def close(self, rst: bool) -> None:
        if self.stream is None:
            return
        if rst:
            try:
                self.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                              struct.pack("ii", 1, 0))
            except OSError:
                pass
        await self.stream.aclose()
