from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, model_validator

from server.api.common.protocol import APIModel, SamplingFields

# vLLM's (and OpenAI's) reasoning efforts; the chat template receives the request's value.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
REASONING_EFFORTS: tuple[str, ...] = get_args(ReasoningEffort)


class ContentPart(APIModel):
    type: str
    text: str | None = None

    @model_validator(mode="after")
    def _text_parts_carry_text(self) -> ContentPart:
        # As vLLM (OpenAI's schema): a text part without a text string is a 400.
        if self.type == "text" and self.text is None:
            raise ValueError("a content part of type 'text' needs a `text` string")
        return self


class ChatMessage(APIModel):
    # OpenAI's roles; a template cannot be trusted to do anything sensible with others.
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    # An assistant turn's reasoning (interleaved thinking); reasoning_content is its name
    # before vLLM 0.34, accepted on input only (chat.tools.history_messages maps both).
    reasoning: str | None = None
    reasoning_content: str | None = None


class FunctionDefinition(APIModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(APIModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, Any]] | None = None
    tools: list[ChatTool] | None = None
    # Checked by server.frontend.chat.tools, in vLLM's order and words (a named choice is
    # {"type": "function", "function": {"name": ...}}).
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    response_format: dict[str, Any] | None = None
    reasoning_effort: ReasoningEffort | None = None
    # With --reasoning-parser: false leaves the reasoning out of the response.
    include_reasoning: bool = True
    # vLLM 0.34's cap on reasoning tokens (Anthropic's thinking.budget_tokens maps here);
    # the engine side that enforces it is declared with the reasoning gate.
    thinking_token_budget: int | None = None
