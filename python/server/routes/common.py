"""Helpers every route uses: body parsing, model check, JSON and SSE responses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from quart import Response, request

from server.errors import APIError, bad_request
from server.protocol.errors import describe
from server.state import ServerState

M = TypeVar("M", bound=BaseModel)


async def read_json() -> dict[str, Any]:
    # As vLLM: the media type must be application/json, also when the header is missing
    # (a body of unknown type is not parsed on a guess).
    ctype = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise bad_request("the request body must be JSON (Content-Type: application/json)")
    raw = await request.get_data(cache=False)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise bad_request("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def parse(model: type[M], body: dict[str, Any]) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        message, param = describe(exc)
        raise bad_request(message, param) from None


def check_model(srv: ServerState, name: str | None) -> str:
    """The served name to report; 404 for a name this server does not serve."""
    names = srv.config.served_model_names
    if not name:
        return names[0]
    if name not in names:
        raise APIError(
            404,
            f"The model `{name[:200]}` does not exist. Valid models: {', '.join(names)}.",
            param="model",
        )
    return name


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status=status, mimetype="application/json")


def sse_response(body: AsyncIterator[bytes]) -> Response:
    response = Response(body, mimetype="text/event-stream")
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Accel-Buffering"] = "no"
    response.timeout = None  # Quart would otherwise cut every stream after RESPONSE_TIMEOUT
    return response
