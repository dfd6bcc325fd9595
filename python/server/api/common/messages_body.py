"""From an Anthropic Messages request to the chat body it amounts to, so that the chat
template, tool planning (`tools.plan_tools`: vLLM's checks, the constraint of a forced
choice, the `--tool-call-parser` of "auto") and the SamplingParams are the chat route's
own, not a second copy of them.

- `system` (a string or text blocks) becomes the first message, a `system` message
  in `messages` stays where it is;
- text blocks become text parts (the template sees them as chat's parts);
- an assistant's `tool_use` blocks become its `tool_calls` (arguments as JSON text, which
  `tools.history_messages` hands to the template as an object);
- a user's `tool_result` blocks become `tool` messages before the user's own text, in
  order, each with its `tool_use_id`; text blocks of a result are joined with newlines, and
  `is_error` puts "Error: " before the text (the template has no other way to say it);
- image blocks are refused (400): the served models read text only;
- a last message from the assistant with text (and no tool_use) is continued
  (Anthropic's prefill), where vLLM 0.33 renders a new assistant turn after it; an empty
  one is left out;
- an assistant's `thinking` blocks become its `reasoning` (joined in order, wherever they
  stand among its text and tool_use blocks: interleaved thinking reaches the template as
  the turn's one reasoning, as vLLM joins it); `redacted_thinking` blocks are dropped
  (opaque); thinking in another role's message is a 400, as tool_use is;
- `output_config.format` -> `response_format` json_schema; `output_config.effort` ->
  `reasoning_effort`, which `thinking` disabled or between_tools then sets to "none" (vLLM
  applies the thinking config last); `thinking` enabled -> `thinking_token_budget` (its
  budget_tokens), adaptive changes nothing;
- tool_choice: auto -> "auto", any -> "required", tool -> the named function, none ->
  "none"; `disable_parallel_tool_use` -> `parallel_tool_calls: false`. Tools without a
  tool_choice are "auto", as vLLM has it.
"""

from __future__ import annotations

import json
from typing import Any

from server.api.common.messages_protocol import (
    AnthropicImageBlock,
    AnthropicMessage,
    AnthropicMessagesRequest,
    AnthropicPromptFields,
    AnthropicTextBlock,
    AnthropicThinkingBlock,
    AnthropicThinkingEnabled,
    AnthropicToolResultBlock,
    AnthropicToolUseBlock,
)
from server.api.common.chat_protocol import ChatCompletionRequest
from server.api.http_io import parse
from server.errors import bad_request

_NO_IMAGES = "image content blocks are not supported: the served model reads text only"


def chat_request(req: AnthropicPromptFields) -> ChatCompletionRequest:
    """The chat request that renders and generates what `req` asks for."""
    messages = chat_messages(req)
    body: dict[str, Any] = {"model": req.model, "messages": messages}
    last = messages[-1]
    if last["role"] == "assistant" and "tool_calls" not in last:
        if last["content"]:
            # Anthropic's prefill: the answer continues the last assistant turn.
            body.update(add_generation_prompt=False, continue_final_message=True)
        else:
            messages.pop()  # an empty one prefills nothing: the answer starts afresh
    if req.chat_template_kwargs is not None:
        body["chat_template_kwargs"] = req.chat_template_kwargs
    if req.tools is not None:
        body["tools"] = [{"type": "function", "function": _function(t.name, t.description,
                                                                    t.input_schema, t.strict)}
                         for t in req.tools]
    choice = req.tool_choice
    if choice is not None:
        if choice.type == "tool" and not choice.name:
            raise bad_request("tool_choice.name is required when type is 'tool'",
                              "tool_choice.name")
        body["tool_choice"] = {
            "auto": "auto", "any": "required", "none": "none",
            "tool": {"type": "function", "function": {"name": choice.name}},
        }[choice.type]
        body["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    config = req.output_config
    if config is not None:
        if config.effort is not None:
            body["reasoning_effort"] = config.effort
        if config.format is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "json_schema", "schema": config.format.json_schema}}
    thinking = req.thinking
    if isinstance(thinking, AnthropicThinkingEnabled):
        body["thinking_token_budget"] = thinking.budget_tokens
    elif thinking is not None and thinking.type in ("disabled", "between_tools"):
        body["reasoning_effort"] = "none"
    if isinstance(req, AnthropicMessagesRequest):
        body.update(max_tokens=req.max_tokens, stream=bool(req.stream),
                    stop=req.stop_sequences, temperature=req.temperature, top_p=req.top_p,
                    top_k=req.top_k, cache_salt=req.cache_salt)
    return parse(ChatCompletionRequest, body)


def _function(name: str, description: str | None, schema: dict[str, Any],
              strict: bool | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "parameters": {"type": "object", **schema}}
    if description is not None:
        function["description"] = description
    if strict is not None:
        function["strict"] = strict
    return function


def chat_messages(req: AnthropicPromptFields) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if req.system:
        system = req.system
        out.append({"role": "system", "content": system if isinstance(system, str)
                    else [_text_part(b) for b in system]})
    for i, message in enumerate(req.messages):
        out.extend(_converted(message, i))
    return out


def _text_part(block: AnthropicTextBlock) -> dict[str, Any]:
    return {"type": "text", "text": block.text}


def _converted(message: AnthropicMessage, index: int) -> list[dict[str, Any]]:
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    where = f"messages.{index}.content"
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []
    for block in message.content:
        if isinstance(block, AnthropicImageBlock):
            raise bad_request(_NO_IMAGES, where)
        if isinstance(block, AnthropicTextBlock):
            parts.append(_text_part(block))
        elif isinstance(block, AnthropicThinkingBlock):
            if message.role != "assistant":
                raise bad_request("thinking blocks may only appear in assistant messages",
                                  where)
            thoughts.append(block.thinking)
        elif isinstance(block, AnthropicToolUseBlock):
            if message.role != "assistant":
                raise bad_request("tool_use blocks may only appear in assistant messages",
                                  where)
            calls.append({"id": block.id, "type": "function", "function": {
                "name": block.name, "arguments": json.dumps(block.input)}})
        elif isinstance(block, AnthropicToolResultBlock):
            if message.role != "user":
                raise bad_request("tool_result blocks may only appear in user messages",
                                  where)
            out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                        "content": _result_text(block, where)})
    if message.role == "assistant":
        converted: dict[str, Any] = {"role": "assistant", "content": parts or ""}
        if thoughts:
            converted["reasoning"] = "".join(thoughts)
        if calls:
            converted["tool_calls"] = calls
        return [*out, converted]
    if parts or not out:
        out.append({"role": message.role, "content": parts})
    return out


def _result_text(block: AnthropicToolResultBlock, where: str) -> str:
    content = block.content
    if content is None or isinstance(content, str):
        text = content or ""
    else:
        if any(isinstance(b, AnthropicImageBlock) for b in content):
            raise bad_request(_NO_IMAGES, where)
        text = "\n".join(b.text for b in content if isinstance(b, AnthropicTextBlock))
    return "Error: " + text if block.is_error else text
