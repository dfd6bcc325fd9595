"""POST /v1/chat/completions: checks, the chat template's deferred render, and the handler
that hands the prompt to the generation service and its output to ChatCompletionRenderer.
Tool choice is planned by `tools` (checks, constraint, parser) and rendered per choice by
`tool_calls`."""

from __future__ import annotations

from typing import Any

from actors.params.sampling import SamplingParams
from actors.runtime.request import PromptInput
from quart import Quart, Response, request

from server.api.http_io import accepts, built_json_response, check_model, parse, read_json
from server.api.lora import with_adapter
from server.api.openai.params import build_params, check_stream_options
from server.api.openai.protocol.chat import ChatCompletionRequest
from server.api.openai.render import ChatCompletionRenderer, sse_body
from server.frontend.chat.tool_calls import choice_factory
from server.frontend.chat.tools import ToolPlan, apply_plan, history_messages, plan_tools
from server.api.openai.unsupported import check_unsupported
from server.errors import bad_request
from server.frontend import service
from server.frontend.generation import new_request_id
from server.sse import sse_response
from server.state import ServerState


def render_call(srv: ServerState, req: Any, tools: list[dict[str, Any]] | None = None) -> Any:
    """Validate the chat inputs now; return the deferred render (run by the tokenizer).
    ``tools``: what the template receives (dicts), when the request's were checked."""
    assert srv.renderer is not None
    messages = history_messages([m.model_dump(exclude_none=True) for m in req.messages])
    if tools is None:
        tools = getattr(req, "tools", None)
        if tools is not None:
            tools = [t if isinstance(t, dict) else t.model_dump(exclude_none=True)
                     for t in tools]
    return srv.renderer.prepare(
        messages,
        request_template=req.chat_template,
        kwargs=template_kwargs(req),
        add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message,
        tools=tools,
        documents=getattr(req, "documents", None),
    )


def template_kwargs(req: Any) -> dict[str, Any] | None:
    """chat_template_kwargs, plus reasoning_effort as vLLM passes it on: under its own name,
    and as enable_thinking unless the request's kwargs set that (a template that reads
    neither never sees them)."""
    effort = getattr(req, "reasoning_effort", None)
    if effort is None:
        return req.chat_template_kwargs
    kwargs = dict(req.chat_template_kwargs or {}, reasoning_effort=effort)
    kwargs.setdefault("enable_thinking", effort != "none")
    return kwargs


def response_role(req: ChatCompletionRequest) -> str:
    """As vLLM: the assistant's, unless no generation prompt is added (the model then
    continues the last message, whose role the response reports)."""
    return "assistant" if req.add_generation_prompt else req.messages[-1].role


def echo_text(req: ChatCompletionRequest, role: str) -> str:
    """echo: the last message's content when it has the response's role ("" otherwise);
    text parts are joined with newlines, as the template sees them."""
    last = req.messages[-1]
    if not req.echo or last.role != role:
        return ""
    content = last.content
    if content is None or isinstance(content, str):
        return content or ""
    return "\n".join(p.text or "" for p in content)


def sampling_params(srv: ServerState, req: ChatCompletionRequest) -> SamplingParams:
    """The request's SamplingParams, chat's names mapped onto the engine's."""
    top = req.top_logprobs
    if top is not None and top != 0 and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")
    logprobs = (top or 0) if req.logprobs else None
    max_tokens = req.max_completion_tokens
    if max_tokens is None:
        max_tokens = req.max_tokens
    # As vLLM: echo scores the prompt with top_logprobs alternatives (0 unless given) unless
    # prompt_logprobs says otherwise; a stream computes none (build_params refuses k > 0).
    prompt_lps = req.prompt_logprobs
    if prompt_lps is None and req.echo:
        prompt_lps = top or 0
    # A 400 names the field the client sent: chat's number of logprobs is top_logprobs.
    aliases = {"logprobs": "top_logprobs"}
    if req.max_completion_tokens is not None:
        aliases["max_tokens"] = "max_completion_tokens"
    assert srv.limits is not None
    return build_params(req, max_tokens=max_tokens, logprobs=logprobs, defaults=srv.defaults,
                        limits=srv.limits, prompt_logprobs=None if req.stream else prompt_lps,
                        aliases=aliases)


def checked(srv: ServerState,
            req: ChatCompletionRequest) -> tuple[str, ToolPlan, SamplingParams]:
    """Every check of a chat body that needs no rendering, in vLLM's order: the served name
    to report, the tool plan and the request's SamplingParams (shared by the batch route)."""
    model = check_model(srv, req.model, adapters=True)
    check_stream_options(req)
    plan = plan_tools(req, srv.config)
    if plan.forced:
        # As vLLM: the tool-call schema is the output's one constraint.
        req.response_format = None
    check_unsupported(req)
    return model, plan, with_adapter(srv, model, apply_plan(sampling_params(srv, req), plan))


async def handle(srv: ServerState, req: ChatCompletionRequest) -> Response:
    model, plan, params = checked(srv, req)
    prompts = [PromptInput(render=render_call(srv, req, plan.tools),
                           add_special_tokens=req.add_special_tokens)]
    rid = new_request_id(request.headers.get("X-Request-Id"), req.request_id)
    gen = await service.start(srv, rid, prompts, params)
    role = response_role(req)
    opts = req.stream_options
    renderer = ChatCompletionRenderer(
        gen, model=model, fingerprint=srv.fingerprint, role=role, echoed=echo_text(req, role),
        logprobs=bool(req.logprobs), top_logprobs=req.top_logprobs or 0,
        include_usage=bool(opts and opts.include_usage),
        continuous_usage=bool(opts and opts.continuous_usage_stats),
        new_choice=choice_factory(plan))
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
