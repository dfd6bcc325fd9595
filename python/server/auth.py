"""API-key check as an ASGI middleware, decided on the request's own path.

The path is taken from the ASGI scope's raw_path (the bytes on the request line), not from
a URL rebuilt with the Host header, then normalised: percent-decoding, repeated slashes and
dot segments cannot make a guarded route look public. Everything is guarded except an
explicit public list; CORS preflights (OPTIONS) pass so browsers can ask first. The key
comes as `Authorization: Bearer` (OpenAI's clients) or `x-api-key` (Anthropic's), on a
WebSocket's handshake as on any request.
"""

from __future__ import annotations

import hashlib
import hmac
import posixpath
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import unquote

from server.api.anthropic import errors as anthropic_errors
from server.errors import envelope_bytes

PUBLIC_PATHS = frozenset({"/health", "/ping", "/ready", "/readyz"})  # the probes

ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


def normalise_path(scope: dict[str, Any]) -> str:
    raw = scope.get("raw_path")
    path = raw.decode("latin-1") if raw else scope.get("path", "/")
    path = path.split("?", 1)[0]
    if not path.startswith("/"):  # absolute-form request target: keep the path part only
        after_scheme = path.split("://", 1)[-1]
        path = "/" + after_scheme.split("/", 1)[1] if "/" in after_scheme else "/"
    for _ in range(3):  # decode repeatedly: %252F must not survive as a different path
        decoded = unquote(path)
        if decoded == path:
            break
        path = decoded
    path = posixpath.normpath("/" + path.lstrip("/"))
    path = "/" + path.lstrip("/")
    return path.rstrip("/") or "/"


def is_public(scope: dict[str, Any]) -> bool:
    """Public only when the path is already canonical: no form of it may route elsewhere."""
    path = normalise_path(scope)
    return path in PUBLIC_PATHS and scope.get("path", "").rstrip("/") == path


def presented_key(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The key a request presents (ASGI headers): `Authorization: Bearer`'s credential (the
    last one), else `x-api-key`'s; b"" when neither. The key check and whoever needs to know
    which client a request is (the Responses store's shares) read it the same way."""
    token = b""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, credential = value.partition(b" ")
            if scheme.lower() == b"bearer":
                token = credential.strip()
        elif name.lower() == b"x-api-key" and not token:
            token = value.strip()
    return token


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, keys: Iterable[str]) -> None:
        self._app = app
        # Compare fixed-size digests so neither length nor content leaks through timing.
        self._digests = [hashlib.sha256(k.encode()).digest() for k in keys if k]

    def _authorised(self, scope: dict[str, Any]) -> bool:
        token = presented_key(scope.get("headers", []))
        digest = hashlib.sha256(token).digest()
        ok = False
        for expected in self._digests:
            ok |= hmac.compare_digest(digest, expected)
        return ok and bool(token)

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if (
            scope["type"] not in ("http", "websocket")
            or not self._digests
            or (scope["type"] == "http" and scope.get("method") == "OPTIONS")
            or is_public(scope)
            or self._authorised(scope)
        ):
            await self._app(scope, receive, send)
            return
        message = "Invalid or missing API key."
        # Anthropic's clients send the key as x-api-key and read their own envelope.
        body = (anthropic_errors.envelope_bytes(401, message)
                if anthropic_errors.is_anthropic_path(normalise_path(scope))
                else envelope_bytes(401, message))
        prefix = "http"
        if scope["type"] == "websocket":
            # The handshake is answered with the 401 itself where the server can (ASGI's
            # websocket.http.response), as vLLM refuses its WebSocket; else a 1008 close.
            if "websocket.http.response" not in scope.get("extensions", {}):
                await send({"type": "websocket.close", "code": 1008})
                return
            prefix = "websocket.http"
        await send(
            {
                "type": f"{prefix}.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": f"{prefix}.response.body", "body": body})
