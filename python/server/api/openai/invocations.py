"""POST /invocations (SageMaker's serving route): a chat or a completions body, told apart
by its shape and answered by that API's handler."""

from __future__ import annotations

from quart import Quart, Response

from server.api.http_io import accepts, parse, read_json
from server.api.openai import chat, completions
from server.api.openai.protocol.chat import ChatCompletionRequest
from server.api.openai.protocol.completions import CompletionRequest
from server.errors import bad_request
from server.state import ServerState


def register(app: Quart, srv: ServerState) -> None:
    @app.post("/invocations")
    @accepts(ChatCompletionRequest, CompletionRequest)
    async def invocations() -> Response:
        body = await read_json()
        if "messages" in body:
            return await chat.handle(srv, parse(ChatCompletionRequest, body))
        if "prompt" in body:
            return await completions.handle(srv, parse(CompletionRequest, body))
        raise bad_request("cannot route this body: expected `messages` (chat) or `prompt` "
                          "(completions)")
