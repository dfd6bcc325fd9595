"""Server-sent events framing for OpenAI-style streams."""

from __future__ import annotations

from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def error_event(status: int, message: str) -> bytes:
    from server.errors import envelope

    return event(envelope(status, message))
