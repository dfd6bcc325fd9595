"""The vLLM chat body (`ChatCompletionRequest`) as the chat core reads it: `to_chat()`, and
every check of the body that needs no rendering, in vLLM's order, with its SamplingParams.

/v1/chat/completions and its batch form, the scale-out render route, and the Anthropic
translation (whose 400s are the chat body's own) share it.
"""

from __future__ import annotations

from actors.params.sampling import SamplingParams

from server.api.common.chat_protocol import ChatCompletionRequest
from server.api.common.params import build_params, check_stream_options, priority_header
from server.api.common.unsupported import check_unsupported
from server.api.http_io import check_model
from server.api.lora import with_adapter
from server.errors import bad_request
from server.frontend.chat.render import template_kwargs
from server.frontend.chat.request import ChatRequest
from server.frontend.chat.tools import ToolPlan, apply_plan, plan_tools
from server.frontend.reasoning_gate import gate_reasoning
from server.state import ServerState


def to_chat(req: ChatCompletionRequest) -> ChatRequest:
    structured = req.structured_outputs
    return ChatRequest(
        messages=tuple(m.model_dump(exclude_none=True) for m in req.messages),
        tools=None if req.tools is None else tuple(
            t.model_dump(exclude_none=True) for t in req.tools),
        tool_choice=req.tool_choice,
        tool_choice_given="tool_choice" in req.model_fields_set,
        parallel_tool_calls=req.parallel_tool_calls,
        structured_outputs=None if structured is None else structured.model_dump(by_alias=True),
        chat_template=req.chat_template,
        chat_template_kwargs=req.chat_template_kwargs,
        reasoning_effort=req.reasoning_effort,
        documents=req.documents,
        add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message,
        add_special_tokens=req.add_special_tokens,
    )


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
    # As vLLM: listed ids replace the top ones.
    listed = req.logprob_token_ids or None
    logprobs = (top or 0) if req.logprobs and not listed else None
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
    return build_params(req, max_tokens=max_tokens, logprobs=logprobs,
                        logprob_token_ids=listed, defaults=srv.defaults,
                        limits=srv.limits, prompt_logprobs=None if req.stream else prompt_lps,
                        aliases=aliases, priority_header=priority_header(),
                        stream_interval=srv.config.stream_interval)


def checked(srv: ServerState, req: ChatCompletionRequest
            ) -> tuple[str, ChatRequest, ToolPlan, SamplingParams]:
    """Every check of a chat body that needs no rendering, in vLLM's order: the served name
    to report, the neutral request, its tool plan and its SamplingParams."""
    model = check_model(srv, req.model, adapters=True)
    check_stream_options(req)
    chat = to_chat(req)
    plan = plan_tools(chat, srv.config)
    if plan.forced:
        # As vLLM: the tool-call schema is the output's one constraint.
        req.response_format = None
    check_unsupported(req)
    params = with_adapter(srv, model, apply_plan(sampling_params(srv, req), plan))
    defaults = srv.renderer.default_kwargs if srv.renderer is not None else None
    params = gate_reasoning(srv, params, budget=req.thinking_token_budget,
                            template_kwargs=template_kwargs(
                                chat, defaults, srv.config.reasoning_effort_map),
                            include_reasoning=req.include_reasoning)
    return model, chat, plan, params
