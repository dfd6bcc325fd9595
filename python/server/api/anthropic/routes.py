"""POST /v1/messages and POST /v1/messages/count_tokens.

A request is translated into the chat request it amounts to
(server.api.common.messages_body, shared with the scale-out /v1/messages/render), then runs
exactly as /v1/chat/completions runs one: the same template render, tool plan,
reasoning plan (`--reasoning-parser`: thinking blocks), SamplingParams, admission, request
id and generation service; only the response shape (`render`) and the error envelope
(`errors`, chosen by the app for these paths) are Anthropic's. count_tokens renders and
tokenizes the prompt a generation would receive, so it equals that generation's
`usage.input_tokens`.
"""

from __future__ import annotations

from actors.runtime.request import PromptInput
from quart import Quart, Response, request

from server.api.common.messages_protocol import (
    AnthropicCountTokensRequest, AnthropicMessagesRequest,
)
from server.api.anthropic.render import MessageStream, message_body, sse_body
from server.api.common.messages_body import chat_request
from server.api.common.chat_body import checked, to_chat
from server.api.common.tokens import token_ids_of
from server.api.http_io import accepts, check_model, json_response, parse, read_json
from server.frontend import service
from server.frontend.chat.reasoning_plan import (
    apply_reasoning,
    plan_reasoning,
    reasoning_factory,
)
from server.frontend.chat.render import render_call
from server.frontend.chat.tool_calls import choice_factory
from server.frontend.chat.tools import plan_tools
from server.frontend.context import context_of
from server.frontend.generation import new_request_id
from server.sse import sse_response
from server.state import ServerState


async def create_message(srv: ServerState, req: AnthropicMessagesRequest) -> Response:
    body = chat_request(req)
    model, chat, plan, params = checked(srv, body)  # every check chat makes, in its order
    # As on chat: the template renders special tokens itself, none are added.
    assert srv.renderer is not None
    thinking = plan_reasoning(chat, srv.config, default_kwargs=srv.renderer.default_kwargs,
                              tokenizer=srv.tokenizer, tool_parser=plan.auto_parser)
    params = apply_reasoning(params, thinking)
    prompts = [PromptInput(render=render_call(srv.renderer, chat, plan.tools),
                           add_special_tokens=chat.add_special_tokens)]
    rid = new_request_id(request.headers.get("X-Request-Id"), None)
    gen = await service.start(context_of(srv), rid, prompts, params)
    choice = reasoning_factory(thinking, choice_factory(plan), gen.prompts[0].text)()
    if req.stream:
        return sse_response(sse_body(gen, MessageStream(gen, model=model, choice=choice)))
    result = await gen.collect()
    return json_response(message_body(gen, result, model=model, choice=choice))


async def count_tokens(srv: ServerState, req: AnthropicCountTokensRequest) -> Response:
    body = chat_request(req)
    check_model(srv, body.model)  # after the translation's checks, as create makes them
    # The tool plan's checks too: a request create would refuse is not counted.
    chat = to_chat(body)
    plan = plan_tools(chat, srv.config)
    assert srv.renderer is not None
    render = render_call(srv.renderer, chat, plan.tools)
    ids = await token_ids_of(srv, render, chat.add_special_tokens)
    return json_response({"input_tokens": len(ids)})


def register(app: Quart, srv: ServerState) -> None:
    @app.post("/v1/messages")
    @accepts(AnthropicMessagesRequest)
    async def v1_messages() -> Response:
        return await create_message(srv, parse(AnthropicMessagesRequest, await read_json()))

    @app.post("/v1/messages/count_tokens")
    @accepts(AnthropicCountTokensRequest)
    async def v1_count_tokens() -> Response:
        return await count_tokens(srv, parse(AnthropicCountTokensRequest, await read_json()))
