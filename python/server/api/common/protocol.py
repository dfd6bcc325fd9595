"""Fields shared by /v1/completions and /v1/chat/completions.

Unknown fields are accepted and ignored (extra="allow"), as OpenAI clients send vendor
extensions freely; the vLLM extensions that would change the output and are not implemented
are refused by name in server.api.common.unsupported. Types are checked here; value ranges by
SamplingParams.validate (through server.api.common.params, which only maps the fields).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class APIModel(BaseModel):
    # strict: a JSON string is not silently a bool or an int ("yes" -> True, "10" -> 10).
    model_config = ConfigDict(extra="allow", protected_namespaces=(), strict=True)


class StreamOptions(APIModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class StructuredOutputs(APIModel):
    """vLLM's ``structured_outputs`` object; exactly one constraint kind is set (checked
    by ``StructuredSpec.from_params``). Unknown keys are refused, as vLLM's dataclass
    refuses them."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), strict=True)
    json_: dict[str, Any] | str | bool | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = None
    whitespace_pattern: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False


class RepetitionDetectionFields(APIModel):
    """vLLM's ``repetition_detection`` object (actors.params.repetition)."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0


class SamplingFields(APIModel):
    model: str | None = None
    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None  # ranges: SamplingParams.validate, once
    stop: str | list[str] | None = None  # how many: SamplingParams.validate
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool | None = None
    prompt_logprobs: int | None = None
    allowed_token_ids: list[int] | None = None
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None
    repetition_detection: RepetitionDetectionFields | None = None
    stream_interval: int | None = None  # streams only; at least --stream-interval
    # the render routes answer token_offsets with it (generation ignores it, as vLLM)
    return_token_offsets: bool | None = False
    priority: int = 0
    cache_salt: str | None = None  # SamplingParams.validate (vLLM's rules and ours)
    # Beam search (vLLM's): n beams; the search ignores the sampling fields, as vLLM's does.
    use_beam_search: bool = False
    length_penalty: float = 1.0
    request_id: str | None = Field(default=None, max_length=256)
    user: str | None = None
    # Structured outputs (server.api.common.structured maps them onto one StructuredSpec);
    # the guided_* fields are vLLM's older spellings, honoured here.
    response_format: dict[str, Any] | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    guided_decoding_backend: str | None = None
    # With --reasoning-parser: reasoning tokens before the end marker is forced (-1: none);
    # chat, completions and Responses alike (server.frontend.reasoning_gate)
    thinking_token_budget: int | None = None
