"""The HTTP plumbing every API module shares: a JSON body read into a pydantic model (and
declared for the OpenAPI document), the served-model check, and JSON responses, built off the
event loop when they are large. The SSE response is server.sse's."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
import trio
from pydantic import BaseModel, ValidationError
from quart import Response, g, request

from server.api.validation_errors import describe
from server.errors import APIError, bad_request
from server.json_depth import MAX_JSON_DEPTH, nesting_depth
from server.state import ServerState

# orjson reads an integer beyond 64 bits as a float (-2**63 - 1 becomes -2**63, in range):
# a body with a run of 19+ digits is read again by the standard parser, which keeps
# integers exact, so that an out-of-range value is refused as out of range (pydantic's
# greater_than_equal / less_than_equal, as vLLM's FastAPI reads it). A run inside a string
# only costs the second read.
_LONG_DIGITS = re.compile(rb"\d{19}")

M = TypeVar("M", bound=BaseModel)
F = TypeVar("F", bound=Callable[..., Any])


def accepts(*models: type[BaseModel]) -> Callable[[F], F]:
    """Declare the body models of a POST route (more than one: any of them), for the
    OpenAPI document; put it under the route decorator."""
    def mark(view: F) -> F:
        view.request_bodies = models  # type: ignore[attr-defined]
        return view
    return mark


async def read_json() -> dict[str, Any]:
    # A body already read by a route that hands the request on (/invocations).
    handed_on = g.get("json_body")
    if handed_on is not None:
        return handed_on
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
    if nesting_depth(raw) > MAX_JSON_DEPTH:
        raise bad_request(f"the request body is nested more than {MAX_JSON_DEPTH} levels deep")
    if _LONG_DIGITS.search(raw):
        try:  # valid JSON (orjson read it) of bounded depth: only a huge integer can fail
            body = json.loads(raw)
        except ValueError:
            raise bad_request("the request body holds an integer too long to read") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def parse(model: type[M], body: dict[str, Any]) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        message, param = describe(exc)
        raise bad_request(message, param) from None


def check_model(srv: ServerState, name: str | None, *, adapters: bool = False) -> str:
    """The served name to report; 404 for a name this server does not serve. adapters: the
    route runs LoRA adapters too (their names are valid models; server.api.lora)."""
    names = srv.config.served_model_names
    if not name:
        return names[0]
    if adapters and srv.lora_names is not None:
        names = names + list(srv.lora_names.adapters)
    if name not in names:
        raise APIError(
            404,
            f"The model `{name[:200]}` does not exist. Valid models: {', '.join(names)}.",
            param="model",
        )
    return name


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status=status, mimetype="application/json")


# A body full of logprobs costs about a microsecond per entry to build, and a prompt's
# logprobs can hold a million entries: such bodies are built and serialized in a worker
# thread (two at a time), so that the event loop keeps serving other streams and /health.
_BUILD_LIMITER = trio.CapacityLimiter(2)


async def built_json_response(build: Callable[[], dict[str, Any]], *,
                              off_loop: bool) -> Response:
    if not off_loop:
        return json_response(build())
    body = await trio.to_thread.run_sync(lambda: _dumps_by_item(build()),
                                         limiter=_BUILD_LIMITER)
    return Response(body, status=200, mimetype="application/json")


def _dumps_by_item(payload: dict[str, Any]) -> bytes:
    """orjson.dumps(payload), writing its lists item by item and dropping each item once
    written: one dumps call, or freeing the whole payload at once, holds the GIL (and so
    stalls the event loop) for as long as it runs, ~60 ms for a 50 MB body."""
    parts = []
    for key, value in payload.items():
        parts.append(b"," if parts else b"{")
        parts.append(orjson.dumps(key) + b":")
        if isinstance(value, list):
            parts.append(b"[")
            for i in range(len(value)):
                parts.append(orjson.dumps(value[i]) if i == 0 else b"," + orjson.dumps(value[i]))
                value[i] = None
            parts.append(b"]")
        else:
            parts.append(orjson.dumps(value))
    parts.append(b"}" if parts else b"{}")
    return b"".join(parts)


def upload_request_class(base: type, paths: frozenset[str], limit: int) -> type:
    """`base` with a larger body limit on `paths`: Quart fixes a request's limit when it
    is created, from MAX_CONTENT_LENGTH (--max-body-bytes), which fits JSON bodies, not
    audio files (25 MB) or weight chunks."""

    class UploadRequest(base):  # type: ignore[valid-type, misc]
        def __init__(self, method: str, scheme: str, path: str, *args: Any,
                     max_content_length: int | None = None, **kwargs: Any) -> None:
            bigger = path in paths and max_content_length is not None
            if bigger:
                max_content_length = max(max_content_length, limit)  # type: ignore[type-var]
            super().__init__(method, scheme, path, *args,
                             max_content_length=max_content_length, **kwargs)
            if bigger:
                self.max_content_length = max_content_length  # the form parser's bound

    return UploadRequest
