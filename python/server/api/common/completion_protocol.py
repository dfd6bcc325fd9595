"""The body of POST /v1/completions."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from server.api.common.protocol import SamplingFields

Prompt = str | list[str] | list[int] | list[list[int]]
DEFAULT_MAX_TOKENS = 16


class CompletionRequest(SamplingFields):
    prompt: Prompt | None = None
    echo: bool = False
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    logprobs: int | None = None
    suffix: str | None = None
    add_special_tokens: bool = True
    # base64 torch.save tensors, taken before the text prompts (server.api.common.embeds)
    prompt_embeds: str | list[str] | None = None
    best_of: int | None = Field(default=None, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _null_max_tokens_is_the_default(cls, data: Any) -> Any:
        # As in vLLM: an explicit "max_tokens": null on /v1/completions means the field's
        # default (16), not "up to the context limit" (that is chat's rule).
        if isinstance(data, dict) and "max_tokens" in data and data["max_tokens"] is None:
            data = {**data, "max_tokens": DEFAULT_MAX_TOKENS}
        return data
