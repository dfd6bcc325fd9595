"""The bodies of POST /v1/messages and POST /v1/messages/count_tokens (Anthropic's Messages
API), which the Anthropic dialect serves and the scale-out /v1/messages/render renders.

Unknown fields are ignored, as vLLM 0.33's Anthropic models ignore them (clients send
`cache_control`, `anthropic-beta` features and the like freely). Types are strict, as on the
OpenAI routes: a JSON string is not silently a number. Value ranges (max_tokens,
temperature, top_p, top_k, how many stop sequences) are SamplingParams.validate's, so the
messages match chat's.

Content blocks are a union on `type`: text, tool_use, tool_result, thinking and
redacted_thinking (an assistant's earlier reasoning, which clients send back), and image,
which is parsed only to be refused by name (the served models read text).

`output_config.format` (a JSON schema) constrains the output as chat's `response_format`
does; `output_config.effort` and `thinking` (disabled or between_tools: effort "none";
enabled: its budget_tokens) are read by server.api.common.messages_body. `display` is
accepted and ignored, as vLLM ignores it: the reasoning is always returned.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class AnthropicModel(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=(), strict=True)


class AnthropicTextBlock(AnthropicModel):
    type: Literal["text"]
    text: str


class AnthropicImageBlock(AnthropicModel):
    type: Literal["image"]
    source: dict[str, Any] | None = None


class AnthropicToolUseBlock(AnthropicModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class AnthropicThinkingBlock(AnthropicModel):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # this server's signatures sign nothing: not checked


class AnthropicRedactedThinkingBlock(AnthropicModel):
    type: Literal["redacted_thinking"]
    data: str | None = None  # opaque: accepted so that a client may echo it, never read


AnthropicResultBlock = Annotated[AnthropicTextBlock | AnthropicImageBlock,
                                 Field(discriminator="type")]


class AnthropicToolResultBlock(AnthropicModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[AnthropicResultBlock] | None = None
    is_error: bool | None = None


AnthropicContentBlock = Annotated[
    AnthropicTextBlock | AnthropicImageBlock | AnthropicToolUseBlock | AnthropicToolResultBlock
    | AnthropicThinkingBlock | AnthropicRedactedThinkingBlock,
    Field(discriminator="type")]


class AnthropicMessage(AnthropicModel):
    # "system" as vLLM accepts it: an instruction in the middle of a conversation.
    role: Literal["user", "assistant", "system"]
    content: str | list[AnthropicContentBlock]


class AnthropicTool(AnthropicModel):
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None  # grammar-enforced input (the chat tool's `strict`)


class AnthropicToolChoice(AnthropicModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class AnthropicJsonOutputFormat(AnthropicModel):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class AnthropicOutputConfig(AnthropicModel):
    # The efforts vLLM accepts; the chat template receives them as reasoning_effort.
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: AnthropicJsonOutputFormat | None = None


class AnthropicThinkingEnabled(AnthropicModel):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1024)


class AnthropicThinkingOther(AnthropicModel):
    # between_tools: off up front, as vLLM maps it (reasoning the model still writes is
    # still returned)
    type: Literal["disabled", "adaptive", "between_tools"]


AnthropicThinking = Annotated[AnthropicThinkingEnabled | AnthropicThinkingOther,
                              Field(discriminator="type")]


class AnthropicPromptFields(AnthropicModel):
    """What both routes render: the conversation, its system prompt and its tools."""

    model: str = Field(min_length=1)
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[AnthropicTextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    output_config: AnthropicOutputConfig | None = None
    thinking: AnthropicThinking | None = None
    # vLLM's extension: extra variables for the chat template.
    chat_template_kwargs: dict[str, Any] | None = None


class AnthropicMessagesRequest(AnthropicPromptFields):
    max_tokens: int  # required, as Anthropic's API has it
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool | None = False
    metadata: dict[str, Any] | None = None
    # vLLM's extension: the prefix-cache namespace.
    cache_salt: str | None = None

    @model_validator(mode="after")
    def _budget_below_max_tokens(self) -> AnthropicMessagesRequest:
        # As vLLM: a thinking budget must leave room for the answer.
        if isinstance(self.thinking, AnthropicThinkingEnabled) and \
                self.thinking.budget_tokens >= self.max_tokens:
            raise ValueError("thinking.budget_tokens must be less than max_tokens")
        return self


class AnthropicCountTokensRequest(AnthropicPromptFields):
    pass
