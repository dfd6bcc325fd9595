"""Dropping clients that stop reading: a write timeout and a buffer cap the HTTP server lacks.

A response send blocks once the client's socket buffers are full. Hypercorn shields that
send from cancellation and has no write timeout, so a client that stops reading would keep
its connection, its task and the buffered rest of its response for as long as it stays
connected. This ASGI middleware notes when each send starts; one watchdog task checks them
and, for a send blocked longer than the stall timeout, resets the connection:

    app send ──blocked──> [stall timeout] ──> SO_LINGER 0 + shutdown(RDWR) on the socket
        -> the blocked send fails, Hypercorn closes the connection, the app sees a
           disconnect: its request is aborted (sequences stopped, KV blocks freed) exactly
           as when a client hangs up.

A client that reads, but slower than its output is generated, never blocks a send that
long; its output piles up instead. The same task therefore also counts what each response
holds for its client: the connection's kernel send queue (bytes written, not yet
acknowledged) plus the output its request has generated and the handler not yet written
(the Outbox, registered by `track_output`). A response over --max-buffered-bytes is dropped
the same way, and while all of them together hold more than --max-total-buffered-bytes the
largest are dropped first. A non-streamed body, already built, counts only as its kernel
send queue: the cap is about output that keeps growing.

The socket is found through the transport's table of open connections (server.transport),
or else by the connection's two addresses (ASGI's scope["client"] and scope["server"]) among
this process's descriptors. The stall timeout is STALL_TIMEOUT seconds, or
LLMSERVE_STALL_TIMEOUT when set (tests use a short one).
"""

from __future__ import annotations

import contextvars
import fcntl
import logging
import os
import socket
import stat
import struct
import termios
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio

from server.config import env_seconds

log = logging.getLogger("server.http")

STALL_TIMEOUT = 60.0
STALL_ENV = "LLMSERVE_STALL_TIMEOUT"

Scope = MutableMapping[str, Any]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def stall_timeout(environ: MutableMapping[str, str] | None = None) -> float:
    return env_seconds(STALL_ENV, STALL_TIMEOUT, environ)


class _Connection:
    __slots__ = ("client", "dropped", "method", "outbox", "path", "server", "since")

    def __init__(self, scope: Scope) -> None:
        self.client = tuple(scope.get("client") or ())
        self.server = tuple(scope.get("server") or ())
        self.method = str(scope.get("method", ""))
        self.path = str(scope.get("path", ""))[:200]
        self.since: float | None = None  # trio.current_time() when the pending send began
        self.dropped = False
        self.outbox: Any = None  # actors.runtime.outbox.Outbox of a generation request


# The response the current task serves, so the request behind it can register its Outbox.
_current: contextvars.ContextVar[_Connection | None] = contextvars.ContextVar(
    "llmserve_response", default=None)


def track_output(outbox: Any) -> None:
    """Count `outbox`'s pending output against the response being served (if any)."""
    conn = _current.get()
    if conn is not None:
        conn.outbox = outbox


class WriteWatchdog:
    """ASGI middleware plus the task (`run`) that drops connections whose sends stall or
    whose output piles up."""

    def __init__(self, app: Any, timeout: float | None = None, *, connections: Any = None,
                 max_buffered: int | None = None, max_total_buffered: int | None = None) -> None:
        self.app = app
        self.timeout = stall_timeout() if timeout is None else timeout
        self.connections = connections  # server.transport.ConnectionTable, or None
        self.max_buffered = max_buffered
        self.max_total_buffered = max_total_buffered
        self._open: set[_Connection] = set()  # requests in flight; `since` set while sending

    async def __call__(self, scope: Scope, receive: Any, send: Send) -> None:
        if scope.get("type") != "http" or not scope.get("client") or not scope.get("server"):
            await self.app(scope, receive, send)
            return
        conn = _Connection(scope)

        async def timed_send(message: MutableMapping[str, Any]) -> None:
            if conn.dropped:
                return  # the connection is gone; the app is about to see the disconnect
            conn.since = trio.current_time()
            try:
                await send(message)
            finally:
                conn.since = None

        self._open.add(conn)  # once per request, not per chunk sent
        token = _current.set(conn)
        try:
            await self.app(scope, receive, timed_send)
        finally:
            _current.reset(token)
            self._open.discard(conn)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
        task_status.started()
        period = min(1.0, self.timeout / 4)
        while True:
            await trio.sleep(period)
            now = trio.current_time()
            for conn in [c for c in self._open if not c.dropped and c.since is not None
                         and now - c.since >= self.timeout]:
                self._drop(conn, f"the client has not read for {self.timeout:.0f} s")
            self._check_buffers()

    def buffered(self, conn: _Connection) -> int:
        """Bytes this response holds for its client (see the module's docstring)."""
        held = conn.outbox.pending_bytes() if conn.outbox is not None else 0
        sock = self._socket(conn)
        return held + (unacknowledged_bytes(sock) if sock is not None else 0)

    def _socket(self, conn: _Connection) -> Any:
        if self.connections is None:
            return None
        return self.connections.socket(conn.client, conn.server)

    def _check_buffers(self) -> None:
        if self.max_buffered is None and self.max_total_buffered is None:
            return
        sizes = sorted(((self.buffered(c), c) for c in self._open if not c.dropped),
                       key=lambda item: item[0], reverse=True)
        total = sum(size for size, _ in sizes)
        for size, conn in sizes:
            if self.max_buffered is not None and size > self.max_buffered:
                why = f"{size} bytes wait for a client reading slower than its output " \
                      f"(--max-buffered-bytes {self.max_buffered})"
            elif self.max_total_buffered is not None and total > self.max_total_buffered:
                why = f"{size} bytes wait for this client while all clients hold {total} " \
                      f"(--max-total-buffered-bytes {self.max_total_buffered})"
            else:
                continue
            total -= size
            self._drop(conn, why)

    def _drop(self, conn: _Connection, why: str) -> None:
        conn.dropped = True
        sock = self._socket(conn)
        reset = (reset_socket(sock) if sock is not None
                 else reset_connection(conn.client, conn.server))
        log.warning("%s %s: %s; %s", conn.method, conn.path, why,
                    "dropping the connection" if reset else "its socket was not found to drop it")


def reset_socket(sock: Any) -> bool:
    """Reset one connection's socket (see reset_connection). True if it was still open."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        return False
    return True


def unacknowledged_bytes(sock: Any) -> int:
    """Bytes in the socket's send queue the peer has not acknowledged (0 where unknown)."""
    try:
        out = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")  # Linux: SIOCOUTQ
    except (OSError, AttributeError, ValueError):
        return 0
    return struct.unpack("i", out)[0]


def reset_connection(client: tuple[Any, ...], server: tuple[Any, ...]) -> bool:
    """Reset this process's TCP connection between these two addresses. True if found.

    SO_LINGER 0 makes the final close a reset that discards unsent data; shutdown wakes a
    send blocked on the socket (it fails with EPIPE) without closing the descriptor under
    the server's feet: the server closes it itself.
    """
    want = (client[:2], server[:2])
    fd_dir = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    for name in os.listdir(fd_dir):
        try:
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except (OSError, ValueError):
            continue
        with sock:
            try:
                if sock.type != socket.SOCK_STREAM or sock.family not in (
                        socket.AF_INET, socket.AF_INET6):
                    continue
                if (tuple(sock.getpeername()[:2]), tuple(sock.getsockname()[:2])) != want:
                    continue
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.shutdown(socket.SHUT_RDWR)
                return True
            except OSError:
                continue
    return False
