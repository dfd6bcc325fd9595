"""The scale-out bodies, as vLLM 0.33 spells them: /inference/v1/generate's GenerateRequest
(token ids and vLLM's SamplingParams fields) and /inference/v1/abort_requests'."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from server.api.common.protocol import APIModel, SamplingFields, StreamOptions

OutputMode = Literal["tokens", "text", "derender"]


class GenerateSamplingParams(SamplingFields):
    """vLLM's SamplingParams as JSON. The fields both share keep SamplingFields' types;
    vLLM's engine-only fields are taken and, where they change nothing here, ignored."""

    max_tokens: int | None = None  # unset: the server's default (until the context is full)
    logprobs: int | None = None
    detokenize: bool = True
    spaces_between_special_tokens: bool = True
    output_kind: int | None = None  # the route decides (stream or whole)
    skip_clone: bool = False


class GenerateRequest(APIModel):
    request_id: str | None = Field(default=None, max_length=256)
    token_ids: list[int] = Field(min_length=1)
    sampling_params: GenerateSamplingParams
    model: str | None = None
    output_mode: OutputMode = "tokens"
    parse_context: dict[str, Any] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None
    cache_salt: str | None = None
    priority: int = 0
    token_offsets: list[tuple[int, int]] | None = None  # render's; not read here
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: dict[str, Any] | None = None
    features: dict[str, Any] | None = None
    content_parts: list[dict[str, Any]] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None


class AbortRequests(APIModel):
    request_ids: list[str]
