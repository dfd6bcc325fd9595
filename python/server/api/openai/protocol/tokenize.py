"""The bodies of POST /tokenize and POST /detokenize (vLLM's)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from server.api.common.chat_protocol import ChatMessage
from server.api.common.protocol import APIModel


class TokenizeRequest(APIModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None


class DetokenizeRequest(APIModel):
    model: str | None = None
    tokens: list[int] = Field(max_length=1_000_000)
