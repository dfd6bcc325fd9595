"""Server-sent events: the framing of one event, the stream's comments, and the streaming
Response.

An event is `data: <json>` alone (the OpenAI APIs) or preceded by `event: <name>` (the
Anthropic Messages and OpenAI Responses APIs, whose clients dispatch on the name).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from quart import Response

from server.config import env_seconds
from server.errors import envelope

DONE = b"data: [DONE]\n\n"
# A comment line: SSE parsers skip it, so it changes no event a client reads. Sent when a
# stream has waited this long for its next chunk, so idle proxies keep the connection
# open (and a client that stopped reading is noticed by the write watchdog).
KEEPALIVE = b": ping\n\n"
KEEPALIVE_ENV = "LLMSERVE_SSE_KEEPALIVE"
KEEPALIVE_INTERVAL = env_seconds(KEEPALIVE_ENV, 15.0)


def event(payload: Any, name: str | None = None) -> bytes:
    """One event: the payload as JSON on one data line, under `name` when given."""
    data = b"data: " + orjson.dumps(payload) + b"\n\n"
    if name is None:
        return data
    # A line break in the name would end the field early and start a line of its own.
    if not name or any(c in name for c in "\r\n"):
        raise ValueError(f"not a valid SSE event name: {name!r}")
    return b"event: " + name.encode() + b"\n" + data


def error_event(status: int, message: str, name: str | None = None) -> bytes:
    return event(envelope(status, message), name)


def sse_response(body: AsyncIterator[bytes]) -> Response:
    response = Response(body, mimetype="text/event-stream")
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Accel-Buffering"] = "no"
    response.timeout = None  # Quart would otherwise cut every stream after RESPONSE_TIMEOUT
    return response
