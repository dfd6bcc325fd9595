"""HTTP/1.1 under Hypercorn's trio worker: no connection can take the server down.

Hypercorn runs each accepted connection as a task in the server's nursery. An exception
that escapes one of them cancels that nursery, and with it every connection, `serve` and
`trio.run`: one malformed request could stop the process (pgjones/hypercorn#203). The
known cause is a race: `TCPServer._close` sends EOF outside the send lock, so a response
written at the same moment (often Hypercorn's own 400 for a malformed chunked body) fails
with `trio.BusyResourceError`, which nothing catches. `install()` puts two subclasses at
the names Hypercorn's trio worker looks up:

    accept -> GuardedTCPServer.run
                over --max-connections? -> 503 envelope, EOF, drain briefly, close
                else Hypercorn's run; a BusyResourceError on send means "closing" (as a
                peer that went away), and any other exception that escapes is logged and
                closes this connection only
              StrictH11Protocol (per request)
                Content-Length with Transfer-Encoding, a repeated Transfer-Encoding -> 400
                more than h11_max_header_count headers, or a header block over
                h11_max_incomplete_size -> 431
                every parse error answered with the JSON envelope, then the connection closes
                a response that comes before its request's body has all arrived (401, 404,
                405, 413...): with a Content-Length up to EARLY_DRAIN_BYTES, the rest of
                the body is read and dropped, then the connection serves the next request
                (the keep-alive timeout bounds the wait); otherwise the response carries
                `Connection: close` and the connection closes after it

The containment and the close fixes apply to any config; the limits and the envelope only
to a `TransportConfig`. Framing is refused, not repaired: behind a proxy that reads the
other length, the bytes after the body would be a second, smuggled request.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

import h11
import hypercorn.protocol
import hypercorn.trio.run
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, RawData, Updated
from hypercorn.protocol.events import Response
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.utils import parse_socket_addr

from server.errors import envelope_bytes

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

log = logging.getLogger("server.http")

Address = tuple[Any, ...]
Key = tuple[Address, Address]  # (client, server), as ASGI's scope spells them

REFUSE_SECONDS = 1.0  # how long a refused connection may take to read its 503
REFUSE_DRAIN_BYTES = 64 * 1024
MAX_REFUSING = 64  # refusals reading their client's request at once; beyond, close at once
TRACE_EVERY = 60.0  # seconds between full tracebacks of connection failures
# The largest body whose unread rest is read and dropped after an early response, so that
# the connection stays usable; a larger one, or one of unknown length, closes it.
EARLY_DRAIN_BYTES = 1024 * 1024

_MESSAGES = {
    400: "The request is not valid HTTP/1.1 (request line, headers or body framing).",
    431: "The request has too many headers or its headers are too large.",
    503: "The server has too many open connections; retry shortly.",
}


class ConnectionTable:
    """Open connections: the count the cap is checked against and each one's socket.

    The write watchdog reads a connection's send queue and resets it through `socket`.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self.refusing = 0
        self._sockets: dict[Key, Any] = {}

    def try_open(self) -> bool:
        if self.count >= self.limit:
            return False
        self.count += 1
        return True

    def close(self) -> None:
        self.count -= 1

    def add(self, key: Key, sock: Any) -> None:
        self._sockets[key] = sock

    def remove(self, key: Key) -> None:
        self._sockets.pop(key, None)

    def socket(self, client: Address, server: Address) -> Any:
        """The trio socket of the open connection between these addresses, or None."""
        return self._sockets.get((tuple(client[:2]), tuple(server[:2])))

    def __len__(self) -> int:
        return self.count


class TransportConfig(HypercornConfig):
    """Hypercorn's config plus the limits the guarded transport enforces."""

    def __init__(self, connections: ConnectionTable, max_header_count: int = 100) -> None:
        super().__init__()
        self.connections = connections
        self.h11_max_header_count = max_header_count


def framing_problem(headers: Sequence[tuple[bytes, bytes]], max_count: int,
                    max_bytes: int) -> int | None:
    """The status refusing a parsed request head (h11's lowercased headers), or None."""
    if len(headers) > max_count or sum(len(n) + len(v) + 4 for n, v in headers) > max_bytes:
        return 431
    names = [name for name, _ in headers]
    if b"transfer-encoding" in names and (
            b"content-length" in names or names.count(b"transfer-encoding") > 1):
        return 400
    return None


class _StrictConnection(h11.Connection):
    def __init__(self, max_incomplete_event_size: int, max_header_count: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_incomplete_event_size)
        self._max_header_count = max_header_count
        self._max_header_bytes = max_incomplete_event_size

    def next_event(self) -> Any:
        event = super().next_event()
        if type(event) is h11.Request:
            status = framing_problem(event.headers, self._max_header_count,
                                     self._max_header_bytes)
            if status is not None:
                # Hypercorn answers with _send_error_response and closes the connection:
                # the request never reaches the app and nothing after it is parsed.
                raise h11.RemoteProtocolError("request framing refused", error_status_hint=status)
        return event


class StrictH11Protocol(H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._body_length: int | None = None  # the current request's Content-Length
        self._draining = False  # reading and dropping the rest of a body answered early
        if isinstance(self.config, TransportConfig):
            self.connection = _StrictConnection(self.config.h11_max_incomplete_size,
                                                self.config.h11_max_header_count)

    async def _create_stream(self, request: h11.Request) -> None:
        self._body_length = None
        for name, value in request.headers:
            if name == b"content-length":  # h11 has checked it is one decimal number
                self._body_length = int(value)
        await super()._create_stream(request)

    async def stream_send(self, event: Any) -> None:
        if (isinstance(event, Response) and event.status_code >= 200
                and isinstance(self.config, TransportConfig)
                and self.connection.their_state is h11.SEND_BODY
                and not (self._body_length is not None
                         and self._body_length <= EARLY_DRAIN_BYTES)
                and not any(n.lower() == b"connection" and v.lower() == b"close"
                            for n, v in event.headers)):
            # Answered before the body arrived, and the rest is too much (or of unknown
            # length) to read and drop: the connection closes after this response, so the
            # response has to say so, or a pooled client sends its next request into it.
            event = Response(stream_id=event.stream_id, status_code=event.status_code,
                             headers=[*event.headers, (b"connection", b"close")])
        await super().stream_send(event)

    async def _maybe_recycle(self) -> None:
        if (isinstance(self.config, TransportConfig) and not self.context.terminated.is_set()
                and self.connection.our_state is h11.DONE
                and self.connection.their_state is h11.SEND_BODY):
            # The response is complete and promised keep-alive (stream_send added no
            # close), but the body has not all arrived: read and drop the rest first. The
            # keep-alive timer bounds how long that may take. Set before any await: from
            # here on, data that arrives is the reader's to drop (handle).
            self._draining = True
            await self._close_stream()
            await self.send(Updated(idle=True))
            await self.can_read.set()
            # While this task waited, the reader may have dropped the rest of the body and
            # started the next cycle itself (then it is no longer draining).
            if self._draining and await self._drop_body():
                # (Nothing pipelined behind the body has been parsed yet; the next data
                # received will be.)
                await self._next_cycle()
            return
        await super()._maybe_recycle()

    async def handle(self, event: Any) -> None:
        if self._draining and isinstance(event, RawData):
            self.connection.receive_data(event.data)
            if await self._drop_body():
                await self._next_cycle()
                await self._handle_events()  # a request already sent behind the body
            return
        await super().handle(event)

    async def _drop_body(self) -> bool:
        """Drop what has arrived of the body. True once it has ended; False while more is
        to come, or when the connection is closing (a broken body, the peer gone)."""
        try:
            while self.connection.their_state is h11.SEND_BODY:
                event = self.connection.next_event()
                if event is h11.NEED_DATA:
                    return False
                if isinstance(event, h11.ConnectionClosed):
                    break
        except h11.RemoteProtocolError:  # a broken body, or the peer closed inside it
            pass
        if self.connection.their_state is h11.DONE and self.connection.our_state is h11.DONE:
            return True
        self._draining = False
        await self.send(Closed())
        return False

    async def _next_cycle(self) -> None:
        self._draining = False
        self.connection.start_next_cycle()
        await self.send(Updated(idle=True))  # the keep-alive timeout starts again
        await self.can_read.set()

    async def _send_error_response(self, status_code: int) -> None:
        if not isinstance(self.config, TransportConfig):
            await super()._send_error_response(status_code)
            return
        # h11 hints 400, 431, or 501 for a transfer coding other than one "chunked"; a
        # malformed request is a 400 (as vLLM's server answers every h11 error).
        status = 431 if status_code == 431 else 400
        body = envelope_bytes(status, _MESSAGES[status])
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()), (b"connection", b"close"),
                   *self.config.response_headers("h11")]
        await self._send_h11_event(h11.Response(status_code=status, headers=headers))
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())


class GuardedTCPServer(TCPServer):
    _last_trace = -TRACE_EVERY

    async def run(self) -> None:
        table = self.config.connections if isinstance(self.config, TransportConfig) else None
        if table is not None and not table.try_open():
            await self._refuse(table)
            return
        key = self._key()
        if table is not None and key is not None:
            table.add(key, self.stream.socket)
        try:
            await super().run()
        except BaseExceptionGroup as group:
            failures, rest = group.split(Exception)
            if failures is not None:
                await self._contain(failures, key)
            if rest is not None:
                raise rest from None
        except Exception as exc:
            await self._contain(exc, key)
        finally:
            if table is not None:
                if key is not None:
                    table.remove(key)
                table.close()

    async def protocol_send(self, event: Any) -> None:
        try:
            await super().protocol_send(event)
        except trio.BusyResourceError:
            # The send lock serialises writes; only _close's EOF writes without it, so the
            # connection is closing under us: the same as a peer that went away.
            await self.protocol.handle(Closed())

    async def _close(self) -> None:
        # Called from the app's task when a response ends the connection (Connection:
        # close, a 413): Quart-Trio cancels that task as soon as Hypercorn reports the
        # stream closed, which used to abandon the close at its first checkpoint and leave
        # the connection open until the client hung up. Both steps are immediate.
        with trio.CancelScope(shield=True):
            await super()._close()

    async def _read_data(self) -> None:
        await super()._read_data()
        if isinstance(self.config, TransportConfig):
            # Reading is over (the peer closed, reset or timed out). Left running, the
            # keep-alive timer would hold this connection, and its place under the cap, for
            # up to keep_alive_timeout more.
            await self.idle_task.stop()

    def _key(self) -> tuple[Address, Address] | None:
        try:
            sock = self.stream.socket
            client = parse_socket_addr(sock.family, sock.getpeername())
            server = parse_socket_addr(sock.family, sock.getsockname())
        except (AttributeError, OSError):  # TLS stream, or the peer is already gone
            return None
        if client is None or server is None:
            return None
        return tuple(client[:2]), tuple(server[:2])

    async def _contain(self, exc: BaseException, key: Key | None) -> None:
        now = time.monotonic()
        trace = now - GuardedTCPServer._last_trace >= TRACE_EVERY
        if trace:
            GuardedTCPServer._last_trace = now
        log.error("connection %s failed (%s: %.200s); closed it", key[0] if key else "?",
                  type(exc).__name__, exc, exc_info=exc if trace else None)
        with trio.CancelScope(shield=True):
            try:
                await self.stream.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    async def _refuse(self, table: ConnectionTable) -> None:
        """503 and close, reading what the client sends for a moment first, so the close
        is a FIN after which it can still read the answer, not a reset that discards it."""
        body = envelope_bytes(503, _MESSAGES[503])
        head = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nretry-after: 1\r\nconnection: close\r\n\r\n" % len(body))
        drain = table.refusing < MAX_REFUSING
        table.refusing += 1
        try:
            with trio.move_on_after(REFUSE_SECONDS):
                await self.stream.send_all(head + body)
                await self.stream.send_eof()
                received = 0
                while drain and received < REFUSE_DRAIN_BYTES:
                    data = await self.stream.receive_some(REFUSE_DRAIN_BYTES)
                    if not data:
                        break
                    received += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError,
                OSError):
            pass
        finally:
            table.refusing -= 1
            with trio.CancelScope(shield=True):
                try:
                    await self.stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass


def install() -> None:
    """Make Hypercorn's trio worker use the guarded classes (idempotent)."""
    if hypercorn.trio.run.TCPServer not in (TCPServer, GuardedTCPServer):
        raise RuntimeError("hypercorn.trio.run.TCPServer is not Hypercorn's: cannot guard it")
    if hypercorn.protocol.H11Protocol not in (H11Protocol, StrictH11Protocol):
        raise RuntimeError("hypercorn.protocol.H11Protocol is not Hypercorn's: cannot guard it")
    hypercorn.trio.run.TCPServer = GuardedTCPServer  # type: ignore[misc]
    hypercorn.protocol.H11Protocol = StrictH11Protocol  # type: ignore[misc]
