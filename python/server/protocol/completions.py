from __future__ import annotations

from pydantic import Field

from server.protocol.common import SamplingFields

Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(SamplingFields):
    prompt: Prompt | None = None
    echo: bool = False
    max_tokens: int | None = 16
    logprobs: int | None = None
    suffix: str | None = None
    add_special_tokens: bool = True
    best_of: int | None = Field(default=None, exclude=True)
