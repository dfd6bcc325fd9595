"""POST /invocations (SageMaker's serving route): any body kind this server serves, told
apart by its shape and answered by that kind's own route.

`INVOCATIONS` is the dispatch table, tried in order, first match wins; adding a kind is one
line (its route, how its bodies look). A kind whose route this server does not mount (the
pooling routes on a generative model, the generation routes under `--runner pooling`) is
skipped. vLLM decides the kind by trying each body model in turn (chat, completions, then the
pooling kinds) and takes the first that validates; a malformed chat body then falls through
to another kind and gets that kind's error, or vLLM's "no suitable handler". Here the kind
is decided by the fields that set the kinds apart, and the body then goes to that kind's
route as if it had been posted there, so a bad field gets the 400 its own route gives.
Beyond vLLM (chat, completions, embeddings, classify, score, rerank), the Anthropic
Messages and OpenAI Responses bodies are dispatched too. A body that matches no kind gets
vLLM's 400.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quart import Quart, Response, g, request

from server.api.common.chat_protocol import ChatCompletionRequest
from server.api.common.completion_protocol import CompletionRequest
from server.api.http_io import accepts, read_json
from server.api.openai import batch
from server.api.openai.batch import BatchChatCompletionRequest
from server.errors import bad_request
from server.state import ServerState

Body = dict[str, Any]


@dataclass(frozen=True)
class Invocation:
    """One body kind: the route that serves it and a test of a body's shape."""

    route: str
    matches: Callable[[Body], bool]


def has(*fields: str) -> Callable[[Body], bool]:
    return lambda body: any(f in body for f in fields)


def responses(body: Body) -> bool:
    # `text` is Responses' output config (an object); other fields only Responses has
    return "input" in body and (isinstance(body.get("text"), dict)
                                or any(f in body for f in _RESPONSES_ONLY))


def anthropic(body: Body) -> bool:
    # Anthropic's SDK sends its version header; without it, fields chat bodies lack
    return "messages" in body and ("anthropic-version" in request.headers
                                   or "system" in body or "stop_sequences" in body)


# Fields of a Responses body that an embeddings body never has (both carry `input`).
_RESPONSES_ONLY = ("instructions", "max_output_tokens", "previous_response_id", "tools", "tool_choice", "store", "background", "reasoning", "stream",
                   "temperature", "top_p", "truncation", "include", "metadata")

# Order is priority: a batch before chat and Anthropic's shape before chat's (all have
# `messages`); a Responses body before embeddings when it says so, else `input` embeds
# where embeddings are served and is a Responses turn where they are not.
INVOCATIONS: tuple[Invocation, ...] = (
    Invocation("/v1/chat/completions/batch", batch.is_batch),
    Invocation("/v1/messages", anthropic),
    Invocation("/v1/chat/completions", has("messages")),
    Invocation("/v1/completions", has("prompt")),
    Invocation("/v1/responses", responses),
    Invocation("/v1/embeddings", has("input")),
    Invocation("/v1/responses", has("input")),
    Invocation("/rerank", lambda body: "query" in body and "documents" in body),
    Invocation("/score", has("queries", "text_1", "data_1")),
)


def _views(app: Quart) -> dict[str, Callable[[], Any]]:
    """The POST view of each route the app mounts."""
    views = {}
    for rule in app.url_map.iter_rules():
        if "POST" in (rule.methods or ()) and rule.rule not in views:
            views[rule.rule] = app.view_functions[rule.endpoint]
    return views


def register(app: Quart, srv: ServerState) -> None:
    @app.post("/invocations")
    @accepts(BatchChatCompletionRequest, ChatCompletionRequest, CompletionRequest)
    async def invocations() -> Response:
        body = await read_json()
        views = _views(app)
        for kind in INVOCATIONS:
            view = views.get(kind.route)
            if view is not None and kind.matches(body):
                g.json_body = body  # the route reads it as its own
                g.invocation_route = kind.route  # what answers it (server.api.orca reads it)
                return await view()
        names = ", ".join(dict.fromkeys(k.route for k in INVOCATIONS if k.route in views))
        raise bad_request(f"Cannot find suitable handler for request. Expected one of: "
                          f"[{names}]")
