"""Responses API input -> chat messages, the form the chat template renders.

    "text"                                    -> one user message
    {"role": ..., "content": str | parts}     -> that message (input_text / output_text
                                                 parts become text parts)
    {"type": "reasoning", ...}                -> an assistant message's `reasoning` (its
                                                 reasoning_text parts joined, else its
                                                 summary's text)
    {"type": "function_call", ...}            -> an assistant message's tool_calls
    {"type": "function_call_output", ...}     -> a role "tool" message for its call_id

An assistant turn spans several items (reasoning, message, calls), which join as vLLM joins
them: reasoning goes on the assistant message just before it unless that has reasoning
already, an assistant message fills the one before it unless that has content, a call is
added to the assistant message before it; otherwise each starts a new assistant message.
So interleaved thinking (reasoning, call, output, reasoning, message) reaches the template
as the turns it was. A reasoning item with `encrypted_content` is a 400: this server
encrypts nothing.

A conversation continued by `previous_response_id` is the stored response's messages (its
own history and input, never its instructions) followed by its output items, reasoning
items included, read by the same rules; the new request's instructions lead as a system
message.
Anything else is a 400 naming `input`, worded as vLLM words it.
"""

from __future__ import annotations

from typing import Any

from server.errors import bad_request
from server.frontend.chat.tools import check_arguments_depth

_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text")


def _text_parts(content: list[Any]) -> list[dict[str, Any]]:
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": "text", "text": part["refusal"]})
            continue
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise bad_request(f"content parts of type {kind!r} are not supported; only "
                              "input_text and output_text are", "input")
        parts.append({"type": "text", "text": part["text"]})
    return parts


def _message(item: dict[str, Any]) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise bad_request(f"Unsupported input message role: {role!r} (one of "
                          f"{', '.join(_ROLES)})", "input")
    content = item.get("content")
    if isinstance(content, list):
        content = _text_parts(content)
    elif not isinstance(content, str):
        raise bad_request("an input message's content must be a string or a list of "
                          "content parts", "input")
    return {"role": role, "content": content}


def _tool_call(item: dict[str, Any]) -> dict[str, Any]:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not (isinstance(call_id, str) and isinstance(name, str) and isinstance(arguments, str)):
        raise bad_request("a function_call item needs string call_id, name and arguments",
                          "input")
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _tool_output(item: dict[str, Any]) -> dict[str, Any]:
    call_id, output = item.get("call_id"), item.get("output")
    if isinstance(output, list):
        output = "\n".join(p["text"] for p in _text_parts(output))
    if not (isinstance(call_id, str) and isinstance(output, str)):
        raise bad_request("a function_call_output item needs a string call_id and output",
                          "input")
    return {"role": "tool", "content": output, "tool_call_id": call_id}


def _reasoning(item: dict[str, Any]) -> str:
    if item.get("encrypted_content"):
        raise bad_request("Encrypted content is not supported.", "input")
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list) or not all(
            isinstance(p, dict) and isinstance(p.get("text"), str) for p in parts):
        raise bad_request("a reasoning item's content and summary must be lists of parts "
                          "with a `text` string", "input")
    if not item.get("content"):
        parts = parts[:1]  # a summary stands in for the reasoning, its first part as vLLM
    return "".join(p["text"] for p in parts)


def items_to_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input (or stored output) items as chat messages, in order."""
    messages: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        last = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
        if kind == "message":
            message = _message(item)
            if last is not None and message["role"] == "assistant" and \
                    last.get("content") is None:
                last["content"] = message["content"]
            else:
                messages.append(message)
        elif kind == "reasoning":
            text = _reasoning(item)
            if last is not None and last.get("reasoning") is None:
                last["reasoning"] = text
            else:
                messages.append({"role": "assistant", "content": None, "reasoning": text})
        elif kind == "function_call":
            if last is not None:
                last.setdefault("tool_calls", []).append(_tool_call(item))
            else:
                messages.append({"role": "assistant", "content": None,
                                 "tool_calls": [_tool_call(item)]})
        elif kind == "function_call_output":
            messages.append(_tool_output(item))
        else:
            raise bad_request(f"Unsupported input item type: {kind}", "input")
    return messages


def input_messages(request_input: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's own input as chat messages (what a later turn continues from)."""
    if isinstance(request_input, str):
        return [{"role": "user", "content": request_input}]
    if not request_input:
        raise bad_request("input must not be empty", "input")
    for index, item in enumerate(request_input):
        if isinstance(item, dict) and item.get("type") == "function_call" and isinstance(
                item.get("arguments"), str):
            check_arguments_depth(item["arguments"], f"input[{index}].arguments")
    return items_to_messages(request_input)


def conversation(instructions: str | None, history: list[dict[str, Any]],
                 messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the template renders: instructions, the earlier turns, this turn's input."""
    lead = [{"role": "system", "content": instructions}] if instructions else []
    return lead + history + messages
