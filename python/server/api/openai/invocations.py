"""POST /invocations (SageMaker's serving route): any body kind this server serves, told
apart by its shape and answered by that kind's own handler.

`INVOCATIONS` is the dispatch table, tried in order, first match wins; adding a kind is one
line (its body model, how its bodies look, its handler). vLLM decides the kind by trying
each body model in turn (chat, then completions) and takes the first that validates; a
malformed chat body then falls through to another kind and gets that kind's error, or
vLLM's "no suitable handler". Here the kind is decided by the fields that set the kinds
apart, and the body is then validated as that kind alone, so a bad field gets the 400 its
own route gives. A body that matches no kind gets vLLM's 400.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from quart import Quart, Response

from server.api.http_io import accepts, parse, read_json
from server.api.openai import batch, chat, completions
from server.api.openai.batch import BatchChatCompletionRequest
from server.api.openai.protocol.chat import ChatCompletionRequest
from server.api.openai.protocol.completions import CompletionRequest
from server.errors import bad_request
from server.state import ServerState


@dataclass(frozen=True)
class Invocation:
    """One body kind: its model, a test of a body's shape, and its route's handler."""

    model: type[BaseModel]
    matches: Callable[[dict[str, Any]], bool]
    handle: Callable[[ServerState, Any], Awaitable[Response]]


def has(field: str) -> Callable[[dict[str, Any]], bool]:
    return lambda body: field in body


# Order is priority: a batch before chat (both have `messages`).
INVOCATIONS: tuple[Invocation, ...] = (
    Invocation(BatchChatCompletionRequest, batch.is_batch, batch.handle),
    Invocation(ChatCompletionRequest, has("messages"), chat.handle),
    Invocation(CompletionRequest, has("prompt"), completions.handle),
)


def register(app: Quart, srv: ServerState) -> None:
    @app.post("/invocations")
    @accepts(*(kind.model for kind in INVOCATIONS))
    async def invocations() -> Response:
        body = await read_json()
        for kind in INVOCATIONS:
            if kind.matches(body):
                return await kind.handle(srv, parse(kind.model, body))
        names = ", ".join(kind.model.__name__ for kind in INVOCATIONS)
        raise bad_request("Cannot find suitable handler for request. Expected one of: "
                          f"[{names}]")
