"""The request body of POST /v1/responses (OpenAI's Responses API, as vLLM 0.33 accepts it).

Input items are kept as plain dicts: their many types are read (and refused by name) by
server.api.openai.responses_input, which turns them into chat messages. The sampling
fields the Responses API shares with chat come from SamplingFields, so that build_params
maps and validates them exactly as it does for chat.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from server.api.common.chat_protocol import ReasoningEffort
from server.api.common.protocol import APIModel, SamplingFields

# vLLM's (and OpenAI's) include values; only the output logprobs change what is returned,
# the others name outputs of tools this server does not run.
Include = Literal[
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
]


class TextConfig(APIModel):
    """`text`: the output's format ({"type": "text" | "json_object" | "json_schema", ...})."""

    format: dict[str, Any] | None = None
    verbosity: str | None = None


class ReasoningConfig(APIModel):
    """`reasoning`: its effort reaches the chat template as chat's reasoning_effort does."""

    effort: ReasoningEffort | None = None
    summary: str | None = None


class ResponsesRequest(SamplingFields):
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    text: TextConfig | None = None
    store: bool | None = True
    background: bool | None = False
    previous_response_id: str | None = Field(default=None, max_length=256)
    include: list[Include] | None = None
    top_logprobs: int | None = None
    metadata: dict[str, str] | None = None
    truncation: Literal["auto", "disabled"] | None = "disabled"
    reasoning: ReasoningConfig | None = None
    # vLLM's: with --reasoning-parser, false leaves the reasoning items out.
    include_reasoning: bool = True
    service_tier: str | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
