"""POST /v1/messages/render: an Anthropic Messages request rendered and tokenized without
generating, as vLLM 0.33 serves it: translated into the chat request /v1/messages runs
(`common.messages_body.chat_request`), then rendered as /v1/chat/completions/render renders
it, so the token ids are exactly what /v1/messages would compute. Errors on this path use
Anthropic's envelope, as on every /v1/messages route."""

from __future__ import annotations

from quart import Quart, Response

from server.api.common.messages_protocol import AnthropicMessagesRequest
from server.api.common.messages_body import chat_request
from server.api.http_io import accepts, json_response, parse, read_json
from server.api.scale_out.render import chat_generate_request
from server.state import ServerState

PATHS = ("/v1/messages/render",)


def register(app: Quart, srv: ServerState) -> None:
    @app.post("/v1/messages/render")
    @accepts(AnthropicMessagesRequest)
    async def messages_render() -> Response:
        req = parse(AnthropicMessagesRequest, await read_json())
        return json_response(await chat_generate_request(srv, chat_request(req)))
