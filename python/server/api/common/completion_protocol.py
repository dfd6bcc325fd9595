"""The body of POST /v1/completions."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from server.api.common.protocol import SamplingFields, TokenIdFields, require_numbers
from server.errors import bad_request

Prompt = str | list[str] | list[int] | list[list[int]]
DEFAULT_MAX_TOKENS = 16


class CompletionRequest(SamplingFields, TokenIdFields):
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
    def _logprob_fields(cls, data: Any) -> Any:
        # vLLM's checks and words, on the body as sent.
        require_numbers(data, ("prompt_logprobs", "logprobs"))
        if isinstance(data, dict) and data.get("logprob_token_ids"):
            if data.get("echo") and data.get("max_tokens") == 0:
                raise bad_request(
                    "`logprob_token_ids` is not supported when `echo=True` and "
                    "`max_tokens=0` because no output tokens are generated.",
                    "logprob_token_ids")
            if data.get("logprobs") is None:
                raise bad_request("when using `logprob_token_ids`, `logprobs` must be set.",
                                  "logprob_token_ids")
        return data

    @model_validator(mode="before")
    @classmethod
    def _null_max_tokens_is_the_default(cls, data: Any) -> Any:
        # As in vLLM: an explicit "max_tokens": null on /v1/completions means the field's
        # default (16), not "up to the context limit" (that is chat's rule).
        if isinstance(data, dict) and "max_tokens" in data and data["max_tokens"] is None:
            data = {**data, "max_tokens": DEFAULT_MAX_TOKENS}
        return data
