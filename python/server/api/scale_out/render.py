"""POST /v1/chat/completions/render and /v1/completions/render: a request's prompt rendered
and tokenized, and its sampling parameters resolved, without generating; the answer is the
body /inference/v1/generate takes (vLLM's GenerateRequest; a list of them for completions,
one per prompt).

The checks are the generation routes' own (`chat_body.checked`, `completion_body.checked`), the
tokens are what /tokenize gives for the same input, and the prompt then passes the check
generation applies (`check_prompt`: vocabulary, context, truncate_prompt_tokens). Another
API renders through the same two steps: `rendered_prompt` (PromptInput -> token ids) and
`generate_request_json` (ids + SamplingParams -> the body), e.g. /v1/messages/render.
`return_token_offsets: true` adds each token's (start, end) characters in the rendered text
(the template's output, for chat) as `token_offsets`, cut as the prompt was truncated; a
prompt of token ids has none (null), as in vLLM.

sampling_params is written as vLLM writes its SamplingParams: vLLM's names, only what
differs from vLLM's defaults, and max_tokens resolved against the prompt's length.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from actors.errors import RequestRefused
from actors.params.prompt import check_prompt
from actors.params.sampling import SamplingParams
from actors.params.structured import StructuredSpec
from actors.runtime.request import PromptInput
from quart import Quart, Response, request

from server.api.common import chat_body, completion_body
from server.api.common.chat_protocol import ChatCompletionRequest
from server.api.common.completion_protocol import CompletionRequest
from server.api.common.protocol import StreamOptions
from server.api.common.tokens import encoded
from server.api.http_io import accepts, json_response, parse, read_json
from server.errors import api_error_of, bad_request
from server.frontend.chat.render import render_call, template_kwargs
from server.frontend.chat.request import ChatRequest
from server.frontend.generation import new_request_id
from server.state import ServerState

PATHS = ("/v1/chat/completions/render", "/v1/completions/render")

# vLLM's SamplingParams defaults, for the fields this server maps (in vLLM's order).
_VLLM_DEFAULTS: dict[str, Any] = {
    "n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
    "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
    "stop": None, "stop_token_ids": None, "ignore_eos": False, "max_tokens": 16,
    "min_tokens": 0, "logprobs": None, "prompt_logprobs": None, "skip_special_tokens": True,
    "spaces_between_special_tokens": True, "include_stop_str_in_output": False,
}
_OUTPUT_KIND = {True: 1, False: 2}  # vLLM's RequestOutputKind: DELTA, FINAL_ONLY


def structured_json(spec: StructuredSpec) -> dict[str, Any]:
    """vLLM's structured_outputs object for a spec."""
    value: Any = spec.value
    if spec.kind in ("json", "structural_tag") and isinstance(value, str):
        value = json.loads(value)
    elif spec.kind == "choice":
        value = list(value or ())
    elif spec.kind == "json_object":
        value = True
    out: dict[str, Any] = {spec.kind: value}
    if spec.whitespace_pattern is not None:
        out["whitespace_pattern"] = spec.whitespace_pattern
    if spec.disable_any_whitespace:
        out["disable_any_whitespace"] = True
    if spec.disable_additional_properties:
        out["disable_additional_properties"] = True
    return out


def vllm_sampling_json(params: SamplingParams, *, max_tokens: int,
                       stream: bool) -> dict[str, Any]:
    fields: dict[str, Any] = {name: getattr(params, name) for name in _VLLM_DEFAULTS}
    fields.update(max_tokens=max_tokens, stop=list(params.stop),
                  stop_token_ids=list(params.stop_token_ids),
                  top_k=0 if params.top_k == -1 else params.top_k)
    out = {k: v for k, v in fields.items() if v != _VLLM_DEFAULTS[k] or k in
           ("stop", "stop_token_ids")}  # vLLM always holds these two as lists
    out["output_kind"] = _OUTPUT_KIND[stream]
    out["skip_clone"] = True
    if params.structured is not None:
        out["structured_outputs"] = structured_json(params.structured)
    if params.logit_bias:
        out["logit_bias"] = {str(k): v for k, v in params.logit_bias.items()}
    if params.allowed_token_ids is not None:
        out["allowed_token_ids"] = list(params.allowed_token_ids)
    gate = params.reasoning_gate
    if gate is not None and gate.thinking_token_budget is not None:
        out["thinking_token_budget"] = gate.thinking_token_budget
    if params.stream_interval is not None:
        out["stream_interval"] = params.stream_interval
    if params.repetition_detection is not None:
        out["repetition_detection"] = asdict(params.repetition_detection)
    return out


async def rendered_prompt(srv: ServerState, prompt: PromptInput, params: SamplingParams,
                          *, offsets: bool = False
                          ) -> tuple[list[int], list[tuple[int, int]] | None]:
    """The token ids the engine would run for `prompt` under `params`: rendered and
    tokenized as /tokenize does, then check_prompt's (a refusal is the generation
    routes' 400); with `offsets`, each kept token's characters in the rendered text (None
    for a prompt of token ids)."""
    spans = None
    if prompt.token_ids is not None:
        ids = list(prompt.token_ids)
    else:
        render = prompt.render
        if render is None:
            text = prompt.text or ""
            render = lambda: text
        ids, spans = await encoded(srv, render, prompt.add_special_tokens)
    assert srv.limits is not None
    try:
        kept = check_prompt(ids, params, srv.limits)
    except RequestRefused as exc:
        raise api_error_of(exc) from None
    if not offsets or spans is None:
        return kept, None
    cut = len(ids) - len(kept)  # truncate_prompt_tokens dropped these, from one side
    return kept, spans[:len(kept)] if params.truncation_side == "right" else spans[cut:]


def generate_request_json(srv: ServerState, request_id: str, token_ids: list[int],
                          params: SamplingParams, *, model: str | None, stream: bool,
                          stream_options: StreamOptions | None,
                          parse_context: dict[str, Any] | None = None,
                          return_token_ids: bool | None = None,
                          token_offsets: list[tuple[int, int]] | None = None) -> dict[str, Any]:
    """vLLM's GenerateRequest, as its render routes write it."""
    assert srv.limits is not None and srv.limits.max_model_len is not None
    room = srv.limits.max_model_len - len(token_ids)
    max_tokens = room if params.max_tokens is None else min(room, params.max_tokens)
    return {
        "request_id": request_id, "token_ids": token_ids, "token_offsets": token_offsets,
        "features": None, "content_parts": None,
        "sampling_params": vllm_sampling_json(params, max_tokens=max_tokens, stream=stream),
        "model": model, "reasoning_ended": None, "reasoning_parser_kwargs": None,
        "return_token_ids": return_token_ids, "output_mode": "tokens",
        "parse_context": parse_context, "stream": stream,
        "stream_options": stream_options.model_dump() if stream and stream_options else None,
        "cache_salt": params.cache_salt, "priority": params.priority,
        "kv_transfer_params": None, "ec_transfer_params": None,
    }


def _parse_context(req: ChatCompletionRequest, chat: ChatRequest,
                   plan_tools: Any) -> dict[str, Any]:
    """What a derendering server needs to parse the output (vLLM's ParseContext)."""
    history = sum(len(m.tool_calls or []) for m in req.messages if m.role == "assistant")
    return {"tools": plan_tools, "tool_choice": req.tool_choice or "none",
            "parallel_tool_calls": req.parallel_tool_calls, "include_reasoning": True,
            "chat_template_kwargs": template_kwargs(chat) or {},
            "history_tool_call_cnt": history}


async def chat_generate_request(srv: ServerState, req: ChatCompletionRequest
                                ) -> dict[str, Any]:
    """The generate request a chat request amounts to (also what /v1/messages/render
    answers for the chat request a Messages request translates to)."""
    _, chat, plan, params = chat_body.checked(srv, req)
    assert srv.renderer is not None
    prompt = PromptInput(render=render_call(srv.renderer, chat, plan.tools),
                         add_special_tokens=chat.add_special_tokens)
    ids, spans = await rendered_prompt(srv, prompt, params,
                                       offsets=bool(req.return_token_offsets))
    rid = new_request_id(request.headers.get("X-Request-Id"), req.request_id)
    return generate_request_json(
        srv, f"chatcmpl-{rid}", ids, params, model=req.model, stream=bool(req.stream),
        stream_options=req.stream_options, parse_context=_parse_context(req, chat, plan.tools),
        return_token_ids=False, token_offsets=spans)


def register(app: Quart, srv: ServerState) -> None:
    @app.post("/v1/chat/completions/render")
    @accepts(ChatCompletionRequest)
    async def chat_render() -> Response:
        req = parse(ChatCompletionRequest, await read_json())
        return json_response(await chat_generate_request(srv, req))

    @app.post("/v1/completions/render")
    @accepts(CompletionRequest)
    async def completions_render() -> Response:
        req = parse(CompletionRequest, await read_json())
        _, prompts, params = completion_body.checked(srv, req)
        if req.prompt_embeds:  # no token ids to render them as
            raise bad_request("prompt_embeds cannot be rendered as token ids",
                              "prompt_embeds")
        base = f"cmpl-{new_request_id(request.headers.get('X-Request-Id'), req.request_id)}"
        out = []
        for i, prompt in enumerate(prompts):
            ids, spans = await rendered_prompt(srv, prompt, params,
                                               offsets=bool(req.return_token_offsets))
            out.append(generate_request_json(
                srv, base if len(prompts) == 1 else f"{base}-{i}", ids, params,
                model=req.model, stream=bool(req.stream), stream_options=req.stream_options,
                return_token_ids=False, token_offsets=spans))
        return json_response(out)
