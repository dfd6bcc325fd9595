"""From a request body to validated SamplingParams, before any tokenizing or rendering.

Value order for each sampling field: the request's value, else the server default (the
model's generation_config.json unless --generation-config vllm), else OpenAI's default.
Every range is SamplingParams.validate's (the engine's one rule book, in the core's float32
and int32); here are only what the HTTP request alone decides (shapes, stream-only rules)
and the checks against this server's context length.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from actors.params.sampling import (
    SamplingParams,
    SamplingParamsError,
    cache_salt_error,
)

from server.errors import bad_request
from server.api.openai.protocol.common import SamplingFields

# Limits of the HTTP edge only (the engine's are SamplingParams.validate's, applied here
# before the prompt is tokenized).
MAX_STOP_TOKEN_IDS = 256
MAX_PROMPTS = 64

OPENAI_DEFAULTS = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


@dataclass(frozen=True, slots=True)
class Limits:
    vocab_size: int
    max_model_len: int
    max_logprobs: int = 20  # vLLM's --max-logprobs (-1: the vocabulary)
    scheduling_policy: str = "fcfs"  # the engine's: priority != 0 needs "priority"


def server_defaults(generation_defaults: Mapping[str, Any] | None) -> dict[str, Any]:
    """The routes' ``defaults``: the engine's generation defaults (``EngineInfo.
    generation_defaults``, read from generation_config.json by actors.params.defaults and
    already named as SamplingParams fields), as they are."""
    return dict(generation_defaults or {})


def build_params(
    req: SamplingFields,
    *,
    max_tokens: int | None,
    logprobs: int | None,
    defaults: dict[str, Any],
    limits: Limits,
    prompt_logprobs: int | None = None,
    aliases: dict[str, str] | None = None,
) -> SamplingParams:
    """``prompt_logprobs``: what the engine computes (the route's choice; echo may imply
    it). ``req.prompt_logprobs`` is checked here as vLLM checks it. ``aliases``: the request
    field a SamplingParams field came from, where the names differ (chat's top_logprobs),
    so that a 400 names what the client sent."""
    def pick(name: str) -> Any:
        value = getattr(req, name)
        if value is not None:
            return value
        if name in defaults:
            return defaults[name]
        return OPENAI_DEFAULTS[name]

    if max_tokens is None:
        max_tokens = defaults.get("max_tokens")
    stop_ids = list(req.stop_token_ids or [])
    if len(stop_ids) > MAX_STOP_TOKEN_IDS:
        raise bad_request(
            f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids are allowed", "stop_token_ids"
        )
    asked = req.prompt_logprobs
    if req.stream and asked is not None and asked != 0:
        # As vLLM: a stream cannot carry them (0 is let through and computes nothing), so
        # the engine never sees this value; vLLM's protocol checks it here.
        if asked < -1:
            raise bad_request("`prompt_logprobs` must be a positive value or -1.",
                              "prompt_logprobs")
        raise bad_request("`prompt_logprobs` are not available when `stream=True`.",
                          "prompt_logprobs")
    allowed = req.allowed_token_ids
    if allowed is not None and len(allowed) > limits.vocab_size:
        raise bad_request("allowed_token_ids is longer than the vocabulary", "allowed_token_ids")
    if req.priority != 0 and limits.scheduling_policy != "priority":
        # vLLM's message (its engine's check); vLLM's protocol documents the refusal.
        raise bad_request(
            f"Got priority {req.priority} but Priority scheduling is not enabled.", "priority"
        )
    salt_problem = cache_salt_error(req.cache_salt)
    if salt_problem is not None:
        raise bad_request(salt_problem, "cache_salt")

    skip = req.skip_special_tokens
    if skip is None:
        skip = bool(defaults.get("skip_special_tokens", True))

    params = SamplingParams(
        n=1 if req.n is None else req.n,
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
        temperature=pick("temperature"),
        top_p=pick("top_p"),
        top_k=pick("top_k"),
        min_p=pick("min_p"),
        presence_penalty=pick("presence_penalty"),
        frequency_penalty=pick("frequency_penalty"),
        repetition_penalty=pick("repetition_penalty"),
        seed=req.seed,  # -1 is None
        stop=req.stop,
        stop_token_ids=stop_ids,
        include_stop_str_in_output=req.include_stop_str_in_output,
        ignore_eos=req.ignore_eos,
        skip_special_tokens=skip,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        logit_bias=_logit_bias(req.logit_bias),
        allowed_token_ids=None if allowed is None else tuple(dict.fromkeys(allowed)),
        truncate_prompt_tokens=req.truncate_prompt_tokens,
        truncation_side=req.truncation_side or "left",
        priority=req.priority,
        cache_salt=req.cache_salt,
    )
    try:
        params.validate(limits.vocab_size, limits.max_logprobs)
    except SamplingParamsError as exc:
        raise bad_request(exc.message, (aliases or {}).get(exc.param, exc.param)) from None
    _check_context(params, limits, aliases or {})
    return params


def _check_context(params: SamplingParams, limits: Limits, aliases: dict[str, str]) -> None:
    """What this server's context length rules out whatever the prompt."""
    length = limits.max_model_len
    if params.max_tokens is not None and params.max_tokens > length:
        raise bad_request(
            f"max_tokens={params.max_tokens} cannot be greater than max_model_len={length}",
            aliases.get("max_tokens", "max_tokens"),
        )
    # A prompt takes at least one position, so min_tokens >= max_model_len can never be met
    # (with max_tokens null the cap is only known after tokenizing; the tokenizer checks).
    if params.min_tokens > length - 1:
        raise bad_request(
            f"min_tokens ({params.min_tokens}) must be less than max_model_len ({length})",
            "min_tokens",
        )
    truncate = params.truncate_prompt_tokens
    if truncate is not None and truncate > length:
        raise bad_request(
            f"truncate_prompt_tokens ({truncate}) is greater than max_model_len ({length})",
            "truncate_prompt_tokens",
        )


def check_stream_options(req: SamplingFields) -> None:
    # As vLLM (and OpenAI): any non-empty stream_options without stream=true is an error,
    # {"include_usage": false} included; an empty object or null is not.
    opts = req.stream_options
    if opts is not None and not req.stream and (opts.model_fields_set or opts.model_extra):
        raise bad_request(
            "Stream options can only be defined when `stream=True`.", "stream_options"
        )


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """JSON object keys are strings; validate() judges the token ids and values."""
    if not bias:
        return None
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            out[int(key)] = value
        except ValueError:
            raise bad_request(
                "logit_bias keys must be token ids written as integers", "logit_bias"
            ) from None
    return out
