"""Server-sent events framing for OpenAI-style streams."""

from __future__ import annotations

from typing import Any

import orjson

from server.config import env_seconds

DONE = b"data: [DONE]\n\n"
# A comment line: SSE parsers skip it, so it changes no event a client reads. Sent when a
# stream has waited this long for its next chunk, so idle proxies keep the connection
# open (and a client that stopped reading is noticed by the write watchdog).
KEEPALIVE = b": ping\n\n"
KEEPALIVE_ENV = "LLMSERVE_SSE_KEEPALIVE"
KEEPALIVE_INTERVAL = env_seconds(KEEPALIVE_ENV, 15.0)


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def error_event(status: int, message: str) -> bytes:
    from server.errors import envelope

    return event(envelope(status, message))
