from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, model_validator

from server.api.common.protocol import (
    SamplingFields,
    TokenIdFields,
    VLLMModel,
    require_numbers,
)
from server.errors import bad_request

# vLLM's (and OpenAI's) reasoning efforts; the chat template receives the request's value.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
REASONING_EFFORTS: tuple[str, ...] = get_args(ReasoningEffort)


class ContentPart(VLLMModel):
    type: str
    text: str | None = None

    @model_validator(mode="after")
    def _text_parts_carry_text(self) -> ContentPart:
        # As vLLM (OpenAI's schema): a text part without a text string is a 400.
        if self.type == "text" and self.text is None:
            raise ValueError("a content part of type 'text' needs a `text` string")
        return self


class ChatMessage(VLLMModel):
    # Any role, as vLLM takes it (its custom-role messages): the template receives it as
    # sent and decides what it means (a template that knows no such role may refuse it).
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    # An assistant turn's reasoning (interleaved thinking); reasoning_content is its name
    # before vLLM 0.34, accepted on input only (chat.tools.history_messages maps both).
    reasoning: str | None = None
    reasoning_content: str | None = None


class FunctionDefinition(VLLMModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(VLLMModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatCompletionRequest(SamplingFields, TokenIdFields):
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

    @model_validator(mode="before")
    @classmethod
    def _logprob_fields(cls, data: Any) -> Any:
        # vLLM's checks and words, on the body as sent.
        require_numbers(data, ("prompt_logprobs", "top_logprobs"))
        return data

    @model_validator(mode="after")
    def _listed_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.logprob_token_ids and not self.logprobs:
            raise bad_request("when using `logprob_token_ids`, `logprobs` must be set to true.",
                              "logprob_token_ids")
        return self
