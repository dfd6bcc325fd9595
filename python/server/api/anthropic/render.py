"""The shapes of a /v1/messages response: the whole message (JSON) and its event stream
(SSE, each record named by its `type`, as Anthropic's SDKs dispatch on the name).

The per-choice state is the chat route's (`tool_calls.choice_factory`, wrapped by
`reasoning_plan.reasoning_factory` with `--reasoning-parser`): it splits the reasoning off
and runs the tool plan's parser over the rest, streamed or whole, and applies vLLM's rules
(`disable_parallel_tool_use` keeps the first call, a named call cut by max_tokens is no
call). This module only turns its reasoning, content and tool calls into Anthropic blocks,
reasoning first within a delta, as vLLM orders them:

    message_start (content [], usage.output_tokens 0)
    content_block_start, ping (once, after the first block starts), content_block_delta
    (thinking_delta | text_delta | input_json_delta) ..., [signature_delta, for a
    thinking block], content_block_stop   -- per block
    message_delta (stop_reason, stop_sequence, usage), message_stop

A thinking block carries a `signature`, as vLLM sends one: random hex that signs nothing
(Anthropic's SDKs expect the field; this server does not check signatures it is sent
back). Usage is vLLM's: output_tokens counts the thinking tokens too, with no separate
count.

A stream that fails after it started ends with an `error` event instead of the last two.
While nothing new comes, `ping` events keep the connection alive.

stop_reason as vLLM maps it: a max_tokens cut is `max_tokens`; complete tool calls are
`tool_use`; a matched stop sequence is `stop_sequence` (with the string); otherwise any
call makes it `tool_use`, and the rest is `end_turn`.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from server import sse
from server.api.anthropic.errors import envelope
from server.errors import status_of_failure
from server.frontend.chat.tool_calls import ChatChoice, is_json
from server.frontend.service import (
    ChoiceDelta,
    Collected,
    Failed,
    Finished,
    Idle,
    TextGeneration,
    Usage,
)

log = logging.getLogger(__name__)

PING = sse.event({"type": "ping"}, "ping")


def message_id(gen: TextGeneration) -> str:
    return f"msg_{gen.request_id}"


def tool_use_id() -> str:
    """An id in Anthropic's shape: `toolu_` and 24 hex digits."""
    return f"toolu_{uuid.uuid4().hex[:24]}"


def signature() -> str:
    return uuid.uuid4().hex


def stop_reason_of(finish_reason: str | None, matched: str | int | None, *,
                   tool_used: bool, tool_complete: bool) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) of a finished choice."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason not in ("stop", "tool_calls"):
        return None, None  # aborted: nothing to report
    if tool_complete:
        return "tool_use", None
    if isinstance(matched, str):  # a stop token id or EOS is not a stop sequence
        return "stop_sequence", matched
    return ("tool_use" if tool_used else "end_turn"), None


def _usage(usage: Usage) -> dict[str, int]:
    return {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}


def _input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the `input` object (the parsers hand over JSON text; a value
    that is not an object, which a tool's input cannot be, becomes {})."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def message_body(gen: TextGeneration, result: Collected, *, model: str,
                 choice: ChatChoice) -> dict[str, Any]:
    """The whole response of a non-streamed request."""
    c = result.choices[0]
    message, _ = choice.message("assistant", "", c.text, c.finish_reason, c.stop_reason)
    content: list[dict[str, Any]] = []
    if message.get("reasoning"):
        content.append({"type": "thinking", "thinking": message["reasoning"],
                        "signature": signature()})
    if message["content"]:
        content.append({"type": "text", "text": message["content"]})
    calls = message.get("tool_calls") or []
    for call in calls:
        function = call["function"]
        content.append({"type": "tool_use", "id": tool_use_id(), "name": function["name"],
                        "input": _input(function["arguments"])})
    if not content:
        # Anthropic's shape of an empty answer: one empty text block, never [].
        content.append({"type": "text", "text": ""})
    reason, sequence = stop_reason_of(c.finish_reason, c.stop_reason,
                                      tool_used=bool(calls), tool_complete=bool(calls))
    return {"id": message_id(gen), "type": "message", "role": "assistant",
            "content": content, "model": model, "stop_reason": reason,
            "stop_sequence": sequence, "usage": _usage(result.usage)}


class MessageStream:
    """The events of one streamed message, block by block."""

    def __init__(self, gen: TextGeneration, *, model: str, choice: ChatChoice) -> None:
        self.gen = gen
        self.model = model
        self.choice = choice
        self._blocks = 0  # blocks started so far; the open one is the last
        self._open: str | None = None  # "thinking", "text" or "tool_use"
        self._call: int | None = None  # the chat index of the open tool_use block
        self._arguments: list[str] = []  # the latest call's argument text
        self._tool_used = False
        self._finish: str | None = None
        self._matched: str | int | None = None

    def start(self) -> list[bytes]:
        usage = {"input_tokens": len(self.gen.prompts[0].token_ids), "output_tokens": 0}
        return [_event({"type": "message_start", "message": {
            "id": message_id(self.gen), "type": "message", "role": "assistant",
            "content": [], "model": self.model, "stop_reason": None, "stop_sequence": None,
            "usage": usage}})]

    def delta(self, d: ChoiceDelta) -> list[bytes]:
        if d.finish_reason is not None:
            self._finish, self._matched = d.finish_reason, d.stop_reason
        out = self.choice.delta(d)
        events: list[bytes] = []
        if not out:
            return events
        thought = out.get("reasoning")
        if thought:
            if self._open != "thinking":
                events += self._start_block({"type": "thinking", "thinking": ""})
            events.append(self._block_delta({"type": "thinking_delta", "thinking": thought}))
        text = out.get("content")
        if text:
            if self._open != "text":
                events += self._start_block({"type": "text", "text": ""})
            events.append(self._block_delta({"type": "text_delta", "text": text}))
        for call in out.get("tool_calls") or []:
            function = call["function"]
            if "id" in call:
                events += self._start_block({"type": "tool_use", "id": tool_use_id(),
                                             "name": function["name"], "input": {}})
                self._call, self._arguments, self._tool_used = call["index"], [], True
            if function.get("arguments") and call["index"] == self._call:
                self._arguments.append(function["arguments"])
                events.append(self._block_delta({"type": "input_json_delta",
                                                 "partial_json": function["arguments"]}))
        return events

    def finish(self, usage: Usage) -> list[bytes]:
        events = self._stop_block()
        if self._blocks == 0:  # as the whole message: one empty text block
            events += self._start_block({"type": "text", "text": ""}) + self._stop_block()
        complete = self._tool_used and is_json("".join(self._arguments))
        reason, sequence = stop_reason_of(self._finish, self._matched,
                                          tool_used=self._tool_used, tool_complete=complete)
        events.append(_event({"type": "message_delta",
                              "delta": {"stop_reason": reason, "stop_sequence": sequence},
                              "usage": _usage(usage)}))
        events.append(_event({"type": "message_stop"}))
        return events

    def fail(self, status: int, message: str) -> list[bytes]:
        return self._stop_block() + [_event(envelope(status, message))]

    def _start_block(self, block: dict[str, Any]) -> list[bytes]:
        events = self._stop_block()
        events.append(_event({"type": "content_block_start", "index": self._blocks,
                              "content_block": block}))
        if self._blocks == 0:
            events.append(PING)  # where Anthropic's API sends its first ping
        self._blocks += 1
        self._open = block["type"]
        return events

    def _block_delta(self, delta: dict[str, Any]) -> bytes:
        return _event({"type": "content_block_delta", "index": self._blocks - 1,
                       "delta": delta})

    def _stop_block(self) -> list[bytes]:
        if self._open is None:
            return []
        events = []
        if self._open == "thinking":
            events.append(self._block_delta({"type": "signature_delta",
                                             "signature": signature()}))
        self._open, self._call = None, None
        events.append(_event({"type": "content_block_stop", "index": self._blocks - 1}))
        return events


def _event(payload: dict[str, Any]) -> bytes:
    return sse.event(payload, payload["type"])


async def sse_body(gen: TextGeneration, stream: MessageStream) -> AsyncIterator[bytes]:
    """The stream's events; `finally` retires the request, also when the client leaves."""
    try:
        for ev in stream.start():
            yield ev
        async with aclosing(gen.stream(idle_after=sse.KEEPALIVE_INTERVAL)) as events:
            async for item in events:
                if isinstance(item, ChoiceDelta):
                    for ev in stream.delta(item):
                        yield ev
                elif isinstance(item, Idle):
                    yield PING
                elif isinstance(item, Failed):
                    for ev in stream.fail(status_of_failure(item.failure), item.message):
                        yield ev
                    return
                elif isinstance(item, Finished):
                    for ev in stream.finish(item.usage):
                        yield ev
    except Exception:
        # A bug of ours after the response started: the client still learns it failed.
        log.exception("the message stream failed")
        yield _event(envelope(500, "internal error"))
    finally:
        gen.retire()
