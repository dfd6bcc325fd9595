"""Fields shared by /v1/completions and /v1/chat/completions.

Unknown fields are accepted and ignored (extra="allow"), as OpenAI clients send vendor
extensions freely; the vLLM extensions that would change the output and are not implemented
are refused by name in server.api.common.unsupported. Types are checked here; value ranges by
SamplingParams.validate (through server.api.common.params, which only maps the fields).

Two bases. The bodies that mirror vLLM's request models (completions, chat, Responses,
generate: ``VLLMModel``) coerce as vLLM's pydantic models do, in pydantic's lax mode: a JSON
string is a bool where vLLM reads one ("true", "yes"), a number where vLLM reads one ("10"),
and an integral float is an int; clients written against vLLM send such bodies. The other
bodies (``APIModel``: tokenize, pooling, the scale-out control bodies, ours alone) stay
strict until their coercions are matched to vLLM's, so a JSON string is not silently a bool
or an int there. Lax values still meet every range check (a "nan" string is a float that
validate refuses), and the logprob counts vLLM checks on the body as sent must be numbers
(``require_numbers``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from server.errors import bad_request

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class APIModel(BaseModel):
    # strict: a JSON string is not silently a bool or an int ("yes" -> True, "10" -> 10).
    model_config = ConfigDict(extra="allow", protected_namespaces=(), strict=True)


class VLLMModel(BaseModel):
    """A body that mirrors one of vLLM's request models, coerced as vLLM's are (lax)."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())


class StreamOptions(VLLMModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class StructuredOutputs(VLLMModel):
    """vLLM's ``structured_outputs`` object; exactly one constraint kind is set (checked
    by ``StructuredSpec.from_params``). Unknown keys are refused, as vLLM's dataclass
    refuses them."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    json_: dict[str, Any] | str | bool | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = None
    whitespace_pattern: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False


class RepetitionDetectionFields(VLLMModel):
    """vLLM's ``repetition_detection`` object (actors.params.repetition)."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0


class SamplingFields(VLLMModel):
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
    # As vLLM: out of int64 is pydantic's greater_than_equal / less_than_equal (clients
    # match on those names); SamplingParams.validate checks the same range offline.
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
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


class TokenIdFields(VLLMModel):
    """vLLM's token-id fields of completions and chat: the prompt's and the output's ids on
    each choice (``return_token_ids``), logprob tokens written "token_id:<id>"
    (``return_tokens_as_token_ids``; None: the server's --return-tokens-as-token-ids), and
    the logprobs of exactly the listed ids at each position (``logprob_token_ids``; their
    count and ids: SamplingParams.validate), and each choice's weight-version spans
    (``return_weight_versions``; actors.core.weight_transfer)."""

    return_token_ids: bool | None = None
    return_weight_versions: bool = False
    return_tokens_as_token_ids: bool | None = None
    logprob_token_ids: list[int] | None = None


def require_numbers(data: Any, names: tuple[str, ...]) -> None:
    """As vLLM, before any coercion: these logprob counts must be JSON numbers (a string
    such as "5" is refused rather than read as one)."""
    if not isinstance(data, dict):
        return
    for name in names:
        value = data.get(name)
        if value is not None and not isinstance(value, (int, float)):
            raise bad_request(f"`{name}` must be an integer.", name)
