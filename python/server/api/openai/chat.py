"""POST /v1/chat/completions: the body's checks and its neutral `ChatRequest`
(server.api.common.chat_body), the chat core's template render, tool plan and reasoning
plan (server.frontend.chat), and the handler that hands the prompt to the generation service
and its output to ChatCompletionRenderer."""

from __future__ import annotations

from actors.runtime.request import PromptInput
from quart import Quart, Response, request

from server.api.common.chat_body import checked, echo_text, response_role
from server.api.common.chat_protocol import ChatCompletionRequest
from server.api.common.render_json import logprob_style
from server.api.common.stream import sse_body
from server.api.http_io import accepts, built_json_response, parse, read_json
from server.api.openai.render import ChatCompletionRenderer
from server.frontend import service
from server.frontend.chat.reasoning_plan import (
    apply_reasoning,
    plan_reasoning,
    reasoning_factory,
)
from server.frontend.chat.render import render_call
from server.frontend.chat.tool_calls import choice_factory
from server.frontend.context import context_of
from server.frontend.generation import new_request_id
from server.sse import sse_response
from server.state import ServerState


async def handle(srv: ServerState, req: ChatCompletionRequest) -> Response:
    model, chat, plan, params = checked(srv, req)
    assert srv.renderer is not None
    thinking = plan_reasoning(chat, srv.config, default_kwargs=srv.renderer.default_kwargs,
                              tokenizer=srv.tokenizer, include_reasoning=req.include_reasoning,
                              tool_parser=plan.auto_parser)
    params = apply_reasoning(params, thinking)
    prompts = [PromptInput(render=render_call(srv.renderer, chat, plan.tools),
                           add_special_tokens=chat.add_special_tokens)]
    rid = new_request_id(request.headers.get("X-Request-Id"), req.request_id)
    gen = await service.start(context_of(srv), rid, prompts, params)
    role = response_role(req)
    opts = req.stream_options
    renderer = ChatCompletionRenderer(
        gen, model=model, fingerprint=srv.fingerprint, role=role, echoed=echo_text(req, role),
        logprobs=bool(req.logprobs), top_logprobs=req.top_logprobs or 0,
        include_usage=bool(opts and opts.include_usage),
        continuous_usage=bool(opts and opts.continuous_usage_stats),
        new_choice=reasoning_factory(thinking, choice_factory(plan), gen.prompts[0].text),
        reasoning_usage=thinking is not None, metrics=srv.config.enable_per_request_metrics,
        return_token_ids=bool(req.return_token_ids),
        return_weight_versions=bool(req.return_weight_versions),
        reasoning_hidden=thinking is not None and not req.include_reasoning,
        style=logprob_style(req.return_tokens_as_token_ids,
                            srv.config.return_tokens_as_token_ids, req.logprob_token_ids))
    if req.stream:
        return sse_response(sse_body(gen, renderer))
    result = await gen.collect()
    return await built_json_response(
        lambda: renderer.response(result),
        off_loop=bool(req.logprobs) or params.prompt_logprobs is not None)


def register(app: Quart, srv: ServerState) -> None:
    @app.post("/v1/chat/completions")
    @accepts(ChatCompletionRequest)
    async def v1_chat() -> Response:
        return await handle(srv, parse(ChatCompletionRequest, await read_json()))
