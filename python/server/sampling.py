"""From a request body to validated SamplingParams, before any tokenizing or rendering.

Value order for each sampling field: the request's value, else the server default (the
model's generation_config.json unless --generation-config vllm), else OpenAI's default.
Limits follow vLLM where vLLM is safe and are tighter where it is not (n, stop strings).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from actors.sampling_params import (
    GREEDY_EPS,
    MAX_N,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    SamplingParams,
    cache_salt_error,
)
from actors.sampling_params import MAX_LOGIT_BIAS_ENTRIES as MAX_LOGIT_BIAS

from server.errors import bad_request
from server.protocol.common import INT64_MAX, INT64_MIN, SamplingFields

# The engine's limits (actors.sampling_params), checked here first so that a bad request is
# refused before its prompt is tokenized; these two exist only at the HTTP edge.
MAX_STOP_TOKEN_IDS = 256
MAX_PROMPTS = 64

# Generation-config keys that become server defaults, and their request field names.
DEFAULT_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "max_new_tokens": "max_tokens",
    "skip_special_tokens": "skip_special_tokens",
}
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
    max_logprobs: int = 20
    scheduling_policy: str = "fcfs"  # the engine's: priority != 0 needs "priority"


def server_defaults(generation_config: dict[str, Any] | None) -> dict[str, Any]:
    """The subset of generation_config.json that acts as request defaults."""
    out: dict[str, Any] = {}
    for key, field in DEFAULT_KEYS.items():
        for name in (key, field):  # raw file keys or already-renamed ones
            if generation_config and generation_config.get(name) is not None:
                out[field] = generation_config[name]
    return out


def build_params(
    req: SamplingFields,
    *,
    max_tokens: int | None,
    logprobs: int | None,
    defaults: dict[str, Any],
    limits: Limits,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    """``prompt_logprobs``: what the engine computes (the route's choice; echo may imply
    it). ``req.prompt_logprobs`` is checked here as vLLM checks it."""
    def pick(name: str) -> Any:
        value = getattr(req, name)
        if value is not None:
            return value
        if name in defaults:
            return defaults[name]
        return OPENAI_DEFAULTS[name]

    temperature = _real(pick("temperature"), "temperature", 0.0, 2.0)
    top_p = _real(pick("top_p"), "top_p", 0.0, 1.0, low_open=True)
    top_k = _int(pick("top_k"), "top_k", -1, None)
    min_p = _real(pick("min_p"), "min_p", 0.0, 1.0)
    presence = _real(pick("presence_penalty"), "presence_penalty", -2.0, 2.0)
    frequency = _real(pick("frequency_penalty"), "frequency_penalty", -2.0, 2.0)
    repetition = _real(pick("repetition_penalty"), "repetition_penalty", 0.0, 2.0, low_open=True)

    n = 1 if req.n is None else _int(req.n, "n", 1, MAX_N)
    if n > 1 and temperature < GREEDY_EPS:
        raise bad_request("n must be 1 when using greedy sampling", "n")

    if max_tokens is None:
        max_tokens = defaults.get("max_tokens")
    if max_tokens is not None:
        _int(max_tokens, "max_tokens", 1, None)
        if max_tokens > limits.max_model_len:
            raise bad_request(
                f"max_tokens={max_tokens} cannot be greater than "
                f"max_model_len={limits.max_model_len}",
                "max_tokens",
            )
    # A prompt takes at least one position, so min_tokens >= max_model_len can never be met
    # (with max_tokens null the cap is only known after tokenizing; the engine checks that).
    min_tokens = _int(req.min_tokens, "min_tokens", 0, limits.max_model_len - 1)
    if max_tokens is not None and min_tokens > max_tokens:
        raise bad_request(
            f"min_tokens ({min_tokens}) must be less than or equal to max_tokens ({max_tokens})",
            "min_tokens",
        )

    stop = _stop_strings(req.stop)
    stop_ids = list(req.stop_token_ids or [])
    if len(stop_ids) > MAX_STOP_TOKEN_IDS:
        raise bad_request(
            f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids are allowed", "stop_token_ids"
        )
    for t in stop_ids:
        _token(t, "stop_token_ids", limits.vocab_size)

    if logprobs is not None:
        _logprobs(logprobs, "logprobs", limits.max_logprobs)
    asked = req.prompt_logprobs
    if asked is not None:
        # As vLLM: a stream cannot carry them (0 is let through and computes nothing).
        if req.stream and (asked > 0 or asked == -1):
            raise bad_request("`prompt_logprobs` are not available when `stream=True`.",
                              "prompt_logprobs")
        if asked < -1:
            raise bad_request("`prompt_logprobs` must be a positive value or -1.",
                              "prompt_logprobs")
    if prompt_logprobs is not None:
        _logprobs(prompt_logprobs, "prompt_logprobs", limits.max_logprobs)

    allowed = req.allowed_token_ids
    if allowed is not None:
        if not allowed:
            raise bad_request("allowed_token_ids must not be empty", "allowed_token_ids")
        if len(allowed) > limits.vocab_size:
            raise bad_request("allowed_token_ids is longer than the vocabulary",
                              "allowed_token_ids")
        for t in allowed:
            _token(t, "allowed_token_ids", limits.vocab_size)
    truncate = req.truncate_prompt_tokens
    if truncate == 0:
        raise bad_request("truncate_prompt_tokens must be -1 or at least 1",
                          "truncate_prompt_tokens")
    if truncate is not None and truncate > limits.max_model_len:
        raise bad_request(
            f"truncate_prompt_tokens ({truncate}) is greater than max_model_len "
            f"({limits.max_model_len})", "truncate_prompt_tokens",
        )

    if req.priority != 0 and limits.scheduling_policy != "priority":
        # vLLM's message (its engine's check); vLLM's protocol documents the refusal.
        raise bad_request(
            f"Got priority {req.priority} but Priority scheduling is not enabled.", "priority"
        )
    salt_problem = cache_salt_error(req.cache_salt)
    if salt_problem is not None:
        raise bad_request(salt_problem, "cache_salt")

    seed = req.seed
    if seed == -1:
        seed = None
    skip = req.skip_special_tokens
    if skip is None:
        skip = bool(defaults.get("skip_special_tokens", True))

    return SamplingParams(
        n=n,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        presence_penalty=presence,
        frequency_penalty=frequency,
        repetition_penalty=repetition,
        seed=seed,
        stop=stop,
        stop_token_ids=stop_ids,
        include_stop_str_in_output=req.include_stop_str_in_output,
        ignore_eos=req.ignore_eos,
        skip_special_tokens=skip,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        logit_bias=_logit_bias(req.logit_bias, limits.vocab_size),
        allowed_token_ids=None if allowed is None else tuple(dict.fromkeys(allowed)),
        truncate_prompt_tokens=truncate,
        truncation_side=req.truncation_side or "left",
        priority=req.priority,
        cache_salt=req.cache_salt,
    )


def check_stream_options(req: SamplingFields) -> None:
    # As vLLM (and OpenAI): any non-empty stream_options without stream=true is an error,
    # {"include_usage": false} included; an empty object or null is not.
    opts = req.stream_options
    if opts is not None and not req.stream and (opts.model_fields_set or opts.model_extra):
        raise bad_request(
            "Stream options can only be defined when `stream=True`.", "stream_options"
        )


def _stop_strings(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > MAX_STOP_STRINGS:
        raise bad_request(f"at most {MAX_STOP_STRINGS} stop strings are allowed", "stop")
    for s in stops:
        if not s:
            raise bad_request("stop strings must not be empty", "stop")
        if len(s) > MAX_STOP_STRING_CHARS:
            raise bad_request(
                f"a stop string may have at most {MAX_STOP_STRING_CHARS} characters", "stop"
            )
    return stops


def _logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float]:
    if not bias:
        return {}
    if len(bias) > MAX_LOGIT_BIAS:
        raise bad_request(f"logit_bias may have at most {MAX_LOGIT_BIAS} entries", "logit_bias")
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise bad_request(
                "logit_bias keys must be token ids written as integers", "logit_bias"
            ) from None
        _token(token, "logit_bias", vocab_size)
        if not math.isfinite(value):
            raise bad_request("logit_bias values must be finite numbers", "logit_bias")
        out[token] = min(max(value, -100.0), 100.0)
    return out


def _logprobs(value: int, name: str, limit: int) -> None:
    if value == -1 and limit == -1:
        return
    if value < 0:
        raise bad_request(f"{name} must be non-negative, got {value}", name)
    if limit != -1 and value > limit:
        raise bad_request(f"{name}={value} exceeds the maximum allowed value of {limit}", name)


def _token(t: int, name: str, vocab_size: int) -> None:
    if not 0 <= t < vocab_size:
        raise bad_request(
            f"token id {t} in {name} is out of vocabulary (vocab size {vocab_size})", name
        )


def _int(x: Any, name: str, low: int | None, high: int | None) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise bad_request(f"{name} must be an integer", name)
    if (low is not None and x < low) or (high is not None and x > high):
        lo = "-inf" if low is None else low
        hi = "inf" if high is None else high
        raise bad_request(f"{name} must be in [{lo}, {hi}], got {x}", name)
    if not INT64_MIN <= x <= INT64_MAX:
        raise bad_request(f"{name} is out of range", name)
    return x


def _real(x: Any, name: str, low: float, high: float, *, low_open: bool = False) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise bad_request(f"{name} must be a finite number", name)
    if (x <= low if low_open else x < low) or x > high:
        bracket = "(" if low_open else "["
        raise bad_request(f"{name} must be in {bracket}{low}, {high}], got {x}", name)
    return float(x)
