"""Anthropic's error envelope, which every failure on /v1/messages* is returned in:

    {"type": "error", "error": {"type": str, "message": str}}

The types are the ones vLLM 0.33 maps statuses to, which Anthropic's SDKs dispatch on
(invalid_request_error 400, authentication_error 401, permission_error 403,
not_found_error 404, request_too_large 413, rate_limit_error 429, overloaded_error 503,
api_error for any other 5xx, invalid_request_error for any other 4xx). The app and the
API-key check choose this envelope by the request's path (`is_anthropic_path`).
"""

from __future__ import annotations

from typing import Any

import orjson

PATH_PREFIX = "/v1/messages"

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    """/v1/messages and everything under it (a mistyped sub-route's 404 included)."""
    return path == PATH_PREFIX or path.startswith(PATH_PREFIX + "/")


def error_type(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def envelope(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def envelope_bytes(status: int, message: str) -> bytes:
    return orjson.dumps(envelope(status, message))
