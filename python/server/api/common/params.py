"""From a request body to validated SamplingParams, before any tokenizing or rendering.

This module only maps: OpenAI/vLLM request fields onto SamplingParams fields, each taking
the request's value, else the model's generation default (EngineInfo.generation_defaults,
read once by actors.params.defaults), else SamplingParams' own default (OpenAI's). Every
range, including those the engine's limits set (context length, vocabulary, max_logprobs,
scheduling policy), is SamplingParams.validate's; its refusal becomes a 400 naming the
field the client sent. What only the HTTP request decides (prompt_logprobs with a stream,
stream_options without one) stays here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actors.errors import RequestRefused
from actors.params.limits import RequestLimits
from actors.params.repetition import RepetitionDetection
from actors.params.sampling import SamplingParams
from quart import has_request_context, request

from server.api.common.protocol import SamplingFields
from server.api.common.structured import spec_of
from server.errors import bad_request

# The HTTP edge's own bound: prompts in one request (each is an engine request).
MAX_PROMPTS = 64

# vLLM's header that sets a request's priority over the body's (chat, completions, Responses).
PRIORITY_HEADER = "X-Vllm-Priority"

# Request fields that fall back to the model's generation defaults when unset.
_DEFAULTED = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
              "frequency_penalty", "repetition_penalty", "skip_special_tokens")


def build_params(
    req: SamplingFields,
    *,
    max_tokens: int | None,
    logprobs: int | None,
    defaults: Mapping[str, Any],
    limits: RequestLimits,
    prompt_logprobs: int | None = None,
    aliases: dict[str, str] | None = None,
    priority_header: str | None = None,
    stream_interval: int = 1,
    logprob_token_ids: list[int] | None = None,
) -> SamplingParams:
    """``prompt_logprobs``: what the engine computes (the route's choice; echo may imply
    it). ``req.prompt_logprobs`` is checked here as vLLM checks it. ``aliases``: the request
    field a SamplingParams field came from, where the names differ (chat's top_logprobs),
    so that a 400 names what the client sent. ``priority_header``: the request's
    X-Vllm-Priority header, which wins over the body's priority when it is an integer (a
    header that is not one is ignored, as vLLM does). ``stream_interval``: the server's
    --stream-interval; a stream's own is raised to it (vLLM's clamp), and a request that
    does not stream has none (vLLM ignores it there). ``logprob_token_ids``: the ids whose
    logprobs each output token reports in place of the top ones."""
    asked = req.prompt_logprobs
    if req.stream and asked is not None and asked != 0:
        # As vLLM: a stream cannot carry them (0 is let through and computes nothing).
        if asked > 0 or asked == -1:
            raise bad_request("`prompt_logprobs` are not available when `stream=True`.",
                              "prompt_logprobs")
        prompt_logprobs = asked  # out of range: validate names it, as vLLM's protocol does

    if max_tokens is None:
        max_tokens = defaults.get("max_tokens")
    allowed = req.allowed_token_ids
    # The fields a beam search and sampling share: what to generate, what to report, how
    # the prompt is cut, scheduling, caching, and the rules the engine applies to both.
    common: dict[str, Any] = dict(
        n=1 if req.n is None else req.n,
        max_tokens=max_tokens,
        ignore_eos=req.ignore_eos,
        include_stop_str_in_output=req.include_stop_str_in_output,
        logprobs=logprobs,
        logprob_token_ids=None if logprob_token_ids is None else tuple(logprob_token_ids),
        allowed_token_ids=None if allowed is None else tuple(allowed),
        truncate_prompt_tokens=req.truncate_prompt_tokens,
        truncation_side=req.truncation_side or "left",
        priority=_priority(req.priority, priority_header),
        cache_salt=req.cache_salt,
        structured=spec_of(req),
        repetition_detection=_repetition(req),
        stream_interval=_stream_interval(req, stream_interval),
    )
    if req.use_beam_search:
        # vLLM's BeamSearchParams: the sampling fields take no part in the search. Only the
        # client's own prompt_logprobs reach the engine (which refuses them for a beam, in
        # vLLM's words); what echo implies is not computed for a beam.
        skip = req.skip_special_tokens
        own: dict[str, Any] = dict(
            use_beam_search=True,
            length_penalty=req.length_penalty,
            prompt_logprobs=None if asked is None or asked == 0 else asked,
            skip_special_tokens=defaults.get("skip_special_tokens", True) if skip is None
            else skip,
        )
    else:
        own = {name: defaults[name] for name in _DEFAULTED if name in defaults}
        own.update((name, getattr(req, name)) for name in _DEFAULTED
                   if getattr(req, name) is not None)
        own.update(
            min_tokens=req.min_tokens,
            seed=req.seed,  # -1 is None
            stop=req.stop,
            stop_token_ids=req.stop_token_ids,
            prompt_logprobs=prompt_logprobs,
            logit_bias=_logit_bias(req.logit_bias),
        )
    params = SamplingParams(**common, **own)
    try:
        params.validate(limits)
    except RequestRefused as exc:
        raise bad_request(exc.message, (aliases or {}).get(exc.param, exc.param)) from None
    return params


def check_stream_options(req: SamplingFields) -> None:
    # As vLLM (and OpenAI): any non-empty stream_options without stream=true is an error,
    # {"include_usage": false} included; an empty object or null is not.
    opts = req.stream_options
    if opts is not None and not req.stream and (opts.model_fields_set or opts.model_extra):
        raise bad_request(
            "Stream options can only be defined when `stream=True`.", "stream_options"
        )


def _repetition(req: SamplingFields) -> RepetitionDetection | None:
    rule = req.repetition_detection
    if rule is None:
        return None
    return RepetitionDetection(rule.max_pattern_size, rule.min_pattern_size, rule.min_count)


def _stream_interval(req: SamplingFields, server: int) -> int | None:
    """The stream's interval in tokens; a bad value is kept for validate to name."""
    asked = req.stream_interval
    if asked is not None and asked < 1:
        return asked
    if not req.stream:
        return None
    return max(asked or 1, server)


def _logit_bias(bias: dict[str, float] | None) -> dict[int | str, float] | None:
    """JSON object keys are strings: those that are integers become token ids, the rest
    stay as sent for validate to name."""
    if not bias:
        return None
    out: dict[int | str, float] = {}
    for key, value in bias.items():
        try:
            out[int(key)] = value
        except ValueError:
            out[key] = value
    return out


def _priority(body: int, header: str | None) -> int:
    if header is not None:
        try:
            return int(header)
        except ValueError:
            pass
    return body


def priority_header() -> str | None:
    """The current HTTP request's X-Vllm-Priority, if there is one."""
    return request.headers.get(PRIORITY_HEADER) if has_request_context() else None
