"""Dropping clients that stop reading: a write timeout the HTTP server does not have.

A response send blocks once the client's socket buffers are full. Hypercorn shields that
send from cancellation and has no write timeout, so a client that stops reading would keep
its connection, its task and the buffered rest of its response for as long as it stays
connected. This ASGI middleware notes when each send starts; one watchdog task checks them
and, for a send blocked longer than the stall timeout, resets the connection:

    app send ──blocked──> [stall timeout] ──> SO_LINGER 0 + shutdown(RDWR) on the socket
        -> the blocked send fails, Hypercorn closes the connection, the app sees a
           disconnect: its request is aborted (sequences stopped, KV blocks freed) exactly
           as when a client hangs up.

The socket is found by the connection's two addresses (ASGI's scope["client"] and
scope["server"]), so nothing depends on the server's internals. The stall timeout is
STALL_TIMEOUT seconds, or LLMSERVE_STALL_TIMEOUT when set (tests use a short one).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import struct
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
    __slots__ = ("client", "dropped", "method", "path", "server", "since")

    def __init__(self, scope: Scope) -> None:
        self.client = tuple(scope.get("client") or ())
        self.server = tuple(scope.get("server") or ())
        self.method = str(scope.get("method", ""))
        self.path = str(scope.get("path", ""))[:200]
        self.since: float | None = None  # trio.current_time() when the pending send began
        self.dropped = False


class WriteWatchdog:
    """ASGI middleware plus the task (`run`) that drops connections whose sends stall."""

    def __init__(self, app: Any, timeout: float | None = None) -> None:
        self.app = app
        self.timeout = stall_timeout() if timeout is None else timeout
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
        try:
            await self.app(scope, receive, timed_send)
        finally:
            self._open.discard(conn)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
        task_status.started()
        period = min(1.0, self.timeout / 4)
        while True:
            await trio.sleep(period)
            now = trio.current_time()
            for conn in [c for c in self._open if not c.dropped and c.since is not None
                         and now - c.since >= self.timeout]:
                self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        conn.dropped = True
        reset = reset_connection(conn.client, conn.server)
        log.warning(
            "%s %s: the client has not read for %.0f s; %s", conn.method, conn.path,
            self.timeout,
            "dropping the connection" if reset else "its socket was not found to drop it",
        )


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
