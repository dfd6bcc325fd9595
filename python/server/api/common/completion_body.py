"""The vLLM completions body (`CompletionRequest`): its prompts (text or token ids) and every
check that needs no tokenizing, in vLLM's order, with its SamplingParams. /v1/completions
and the scale-out render route share it."""

from __future__ import annotations

from typing import Any

from actors.params.sampling import SamplingParams
from actors.runtime.request import PromptInput

from server.api.common import embeds
from server.api.common.completion_protocol import CompletionRequest
from server.api.common.params import (
    MAX_PROMPTS,
    build_params,
    check_stream_options,
    priority_header,
)
from server.api.common.unsupported import check_unsupported
from server.api.http_io import check_model
from server.api.lora import with_adapter
from server.errors import bad_request
from server.frontend.reasoning_gate import gate_reasoning
from server.state import ServerState


# vLLM's words (clients match on them); prompt_embeds is vLLM's other prompt field.
EMPTY_PROMPT = "Either prompt or prompt_embeds must be provided and non-empty."


def prompts_of(req: CompletionRequest) -> list[PromptInput]:
    """The text and token-id prompts; none when only prompt_embeds are given (those are
    decoded apart: server.api.common.embeds)."""
    p = req.prompt
    if p is None or p == "" or p == []:
        if req.prompt_embeds:
            return []
        raise bad_request(EMPTY_PROMPT, "prompt")
    if isinstance(p, str):
        items: list[Any] = [p]
    elif all(isinstance(x, int) for x in p):
        items = [p]
    else:
        items = list(p)
    if len(items) > MAX_PROMPTS:
        raise bad_request(f"at most {MAX_PROMPTS} prompts per request", "prompt")
    out = []
    for item in items:
        if isinstance(item, str):
            if not item:
                raise bad_request("prompt must not contain empty strings", "prompt")
            out.append(PromptInput(text=item, add_special_tokens=req.add_special_tokens))
        else:
            if not item:
                raise bad_request("a token-id prompt must not be empty", "prompt")
            # Its ids are check_prompt's, in the tokenizer actor (the offline LLM's check).
            out.append(PromptInput(token_ids=list(item)))
    return out


def echo_only(req: CompletionRequest) -> bool:
    """As vLLM: echo with max_tokens=0 returns the prompt alone (one token is generated and
    dropped, and counted in usage as vLLM counts it)."""
    return req.echo and req.max_tokens == 0


def sampling_params(srv: ServerState, req: CompletionRequest) -> SamplingParams:
    # As vLLM: echo with logprobs scores the prompt with as many alternatives, unless
    # prompt_logprobs says otherwise; a stream computes none (build_params refuses k > 0).
    prompt_lps = req.prompt_logprobs
    if prompt_lps is None and req.echo and req.logprobs is not None:
        prompt_lps = req.logprobs
    assert srv.limits is not None
    # As vLLM: listed ids replace the top ones (logprobs only has to be set).
    listed = req.logprob_token_ids or None
    return build_params(
        req, max_tokens=1 if echo_only(req) else req.max_tokens,
        logprobs=None if listed else req.logprobs, logprob_token_ids=listed,
        defaults=srv.defaults, limits=srv.limits,
        prompt_logprobs=None if req.stream else prompt_lps, priority_header=priority_header(),
        stream_interval=srv.config.stream_interval,
    )


def checked(srv: ServerState, req: CompletionRequest
            ) -> tuple[str, list[PromptInput], SamplingParams]:
    """Every check of a completions body that needs no tokenizing, in vLLM's order: the
    served name to report, the prompts and the request's SamplingParams."""
    model = check_model(srv, req.model, adapters=True)
    if req.suffix is not None:
        raise bad_request("suffix is not supported by this model", "suffix")
    check_stream_options(req)
    check_unsupported(req)
    if req.use_beam_search and req.stream:  # vLLM's 400s
        raise bad_request("Streaming is not currently supported with beam search", "stream")
    if req.use_beam_search and req.echo and req.logprobs is not None:
        raise bad_request("`echo` with `logprobs` is not supported with beam search because "
                          "beam search does not compute prompt logprobs.", "echo")
    if req.echo and req.logprobs is not None and req.stream:
        # vLLM streams the prompt's logprobs in front of the first chunk; not done here yet.
        raise bad_request("echo with logprobs is not supported with stream=true by this "
                          "server yet", "echo")
    embeds.check_request(req)
    params = gate_reasoning(srv, sampling_params(srv, req), budget=req.thinking_token_budget)
    return model, prompts_of(req), with_adapter(srv, model, params)
