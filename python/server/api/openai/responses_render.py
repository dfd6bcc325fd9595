"""The Responses API's shapes: the `response` object, its output items and the typed
stream events, as the openai SDK's models (openai.types.responses) read them.

One `OutputBuilder` per response turns the generation's text into output items, streamed
or whole, by the same steps, so a streamed response ends with the very items a whole one
has: text becomes a `message` item with one `output_text` part; with a tool-call parser
(the request's ToolPlan, as on chat) what it reads as calls becomes `function_call` items,
and text around them message items of their own. With `--reasoning-parser` (the request's
ReasoningPlan, as on chat) the reasoning is split off first and becomes a `reasoning` item
(`summary` [], one `reasoning_text` part), streamed as vLLM 0.34 streams it:
output_item.added, content_part.added, response.reasoning_text.delta ...,
response.reasoning_text.done, content_part.done, output_item.done; vLLM writes no summary,
so there are no summary events. Only the content reaches the tool-call parser, and usage
counts output_tokens_details.reasoning_tokens. Logprobs go with text no parser splits. `feed` returns the events each step
makes (without sequence numbers: `EventCounter` numbers them as they go out). Items keep
their ids from `output_item.added` to the final response, as the SDK's stream helper
checks.

The last item of a generation cut by max_output_tokens is `incomplete`, and so is the
response (incomplete_details.reason "max_output_tokens"), as vLLM reports it. A stored
stream whose client left before its end is stored `incomplete` with what was generated,
reason "client_disconnected" (this server's: OpenAI's reasons do not cover it).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from actors.runtime.messages import ChoiceTiming

from server.api.common.render_json import metrics_json
from server.frontend.chat.reasoning_plan import ReasoningPlan
from server.frontend.chat.tool_parsers import ContentDelta, ToolCallDelta
from server.frontend.chat.tools import ToolPlan
from server.frontend.logprobs import LogprobEntry
from server.frontend.service import ChoiceResult, Usage

DISCONNECTED = "client_disconnected"  # incomplete_details.reason of an abandoned stream


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_json(usage: Usage, reasoning_tokens: int = 0) -> dict[str, Any]:
    # This server keeps no per-request count of prefix-cache hits: cached_tokens is 0.
    return {"input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": usage.total_tokens}


def logprobs_json(items: Sequence[LogprobEntry], top: int) -> list[dict[str, Any]]:
    return [{"token": e.text, "bytes": list(e.bytes), "logprob": max(e.logprob, -9999.0),
             "top_logprobs": [{"token": t.text, "bytes": list(t.bytes),
                               "logprob": max(t.logprob, -9999.0)} for t in e.top[:top]]}
            for e in items]


class ResponseShape:
    """The request's fields every response object echoes, and the object itself."""

    def __init__(self, *, response_id: str, model: str, echo: dict[str, Any],
                 metrics: bool = False) -> None:
        self.id = response_id
        self.model = model
        self.created_at = int(time.time())
        self.echo = echo
        self.metrics = metrics  # --enable-per-request-metrics: a finished one carries them

    def body(self, status: str, output: list[dict[str, Any]], usage: Usage | None = None,
             *, error: dict[str, Any] | None = None,
             incomplete_reason: str = "max_output_tokens",
             reasoning_tokens: int = 0) -> dict[str, Any]:
        incomplete = {"reason": incomplete_reason} if status == "incomplete" else None
        finished = status in ("completed", "incomplete", "failed", "cancelled")
        return {"id": self.id, "object": "response", "created_at": self.created_at,
                "status": status,
                "completed_at": int(time.time()) if finished else None,
                "error": error, "incomplete_details": incomplete, "model": self.model,
                "output": output, **self.echo,
                "usage": None if usage is None else usage_json(usage, reasoning_tokens)}


class _Message:
    __slots__ = ("id", "index", "logprobs", "text")

    def __init__(self, index: int) -> None:
        self.id = new_id("msg")
        self.index = index
        self.text: list[str] = []
        self.logprobs: list[dict[str, Any]] = []

    def item(self, status: str) -> dict[str, Any]:
        content = [] if status == "in_progress" else [self.part()]
        return {"id": self.id, "type": "message", "role": "assistant", "status": status,
                "content": content}

    def part(self, text: str | None = None) -> dict[str, Any]:
        return {"type": "output_text", "text": "".join(self.text) if text is None else text,
                "annotations": [], "logprobs": [] if text is not None else self.logprobs}


class _Reasoning:
    __slots__ = ("id", "index", "text")

    def __init__(self, index: int) -> None:
        self.id = new_id("rs")
        self.index = index
        self.text: list[str] = []

    def item(self, status: str) -> dict[str, Any]:
        content = None if status == "in_progress" else [self.part()]
        return {"id": self.id, "type": "reasoning", "summary": [], "content": content,
                "encrypted_content": None, "status": status}

    def part(self, text: str | None = None) -> dict[str, Any]:
        return {"type": "reasoning_text", "text": "".join(self.text) if text is None else text}


class _Call:
    __slots__ = ("arguments", "call_id", "id", "index", "name")

    def __init__(self, index: int, call_id: str, name: str) -> None:
        self.id = new_id("fc")
        self.index = index
        self.call_id = call_id
        self.name = name
        self.arguments: list[str] = []

    def item(self, status: str) -> dict[str, Any]:
        return {"id": self.id, "type": "function_call", "call_id": self.call_id,
                "name": self.name, "arguments": "".join(self.arguments), "status": status}


class OutputBuilder:
    """The output items of one generation, built from its text deltas."""

    def __init__(self, plan: ToolPlan, top_logprobs: int | None,
                 thinking: ReasoningPlan | None = None, prompt: str | None = None) -> None:
        self._plan = plan
        self._stream = plan.parser.new_stream() if plan.parser is not None else None
        self._thinking = None if thinking is None else thinking.new_parser(prompt).stream()
        self._show_thinking = thinking is not None and thinking.include_reasoning
        # Logprobs go with the text they scored; a parser's split of it carries none.
        self._top = top_logprobs if self._stream is None and self._thinking is None else None
        self._items: list[_Message | _Call | _Reasoning] = []
        self._done: dict[int, dict[str, Any]] = {}  # output index -> the finished item
        self._open: _Message | _Call | _Reasoning | None = None
        self._calls: dict[int, _Call] = {}  # the parser's call index -> its item

    @property
    def reasoning_tokens(self) -> int:
        return 0 if self._thinking is None else self._thinking.reasoning_tokens

    @property
    def output(self) -> list[dict[str, Any]]:
        """The finished items, in order (every item, once the generation has finished)."""
        return [self._done[i] for i in sorted(self._done)]

    def feed_whole(self, result: ChoiceResult) -> None:
        """A whole generation, fed as its deltas came (the reasoning tokens are counted
        per delta, as a stream counts them)."""
        reason = result.finish_reason or "stop"
        if self._thinking is None:
            self.feed(result.text, result.logprobs, reason)
            return
        pieces = result.pieces or [(result.text, len(result.token_ids))]
        at = 0
        for i, (text, count) in enumerate(pieces):
            self.feed(text, [], reason if i == len(pieces) - 1 else None,
                      result.token_ids[at:at + count])
            at += count

    def feed(self, text: str, logprobs: Sequence[LogprobEntry], finish_reason: str | None,
             token_ids: Sequence[int] = ()) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        lps = [] if self._top is None else logprobs_json(logprobs, self._top)
        if self._thinking is not None:
            thought, text = self._thinking.feed(text, token_ids)
            if finish_reason is not None:
                more = self._thinking.finish()
                thought, text = thought + more[0], text + more[1]
            if thought and self._show_thinking:
                events += self._reason(thought)
        if self._stream is None:
            if text:
                events += self._text(text, lps)
        else:
            deltas = self._stream.feed(text) if text else []
            if finish_reason is not None:
                deltas += self._stream.finish()
            for d in deltas:
                if isinstance(d, ContentDelta):
                    if d.text:
                        events += self._text(d.text, [])
                elif isinstance(d, ToolCallDelta) and self._keeps(d):
                    events += self._call(d)
        if finish_reason is not None:
            events += self._close("incomplete" if finish_reason == "length" else "completed")
        return events

    def _keeps(self, d: ToolCallDelta) -> bool:
        return not (d.index > 0 and self._plan.parallel_tool_calls is False)

    def _opened(self, kind: type[_Message] | type[_Reasoning]) -> list[dict[str, Any]]:
        """The events that open an item of `kind` (a message or a reasoning item), after
        closing the item open before it; none when one of that kind is open already."""
        if isinstance(self._open, kind):
            return []
        events = self._close("completed")
        item = kind(len(self._items))
        self._items.append(item)
        self._open = item
        return events + [{"type": "response.output_item.added", "output_index": item.index,
                          "item": item.item("in_progress")},
                         {"type": "response.content_part.added", "item_id": item.id,
                          "output_index": item.index, "content_index": 0,
                          "part": item.part("")}]

    def _text(self, text: str, lps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events = self._opened(_Message)
        msg = self._open
        assert isinstance(msg, _Message)
        msg.text.append(text)
        msg.logprobs += lps
        events.append({"type": "response.output_text.delta", "item_id": msg.id,
                       "output_index": msg.index, "content_index": 0, "delta": text,
                       "logprobs": lps})
        return events

    def _reason(self, text: str) -> list[dict[str, Any]]:
        events = self._opened(_Reasoning)
        item = self._open
        assert isinstance(item, _Reasoning)
        item.text.append(text)
        events.append({"type": "response.reasoning_text.delta", "item_id": item.id,
                       "output_index": item.index, "content_index": 0, "delta": text})
        return events

    def _call(self, d: ToolCallDelta) -> list[dict[str, Any]]:
        events = []
        call = self._calls.get(d.index)
        if call is None:
            events += self._close("completed")
            call = _Call(len(self._items), d.id or new_id("call"), d.name or "")
            self._items.append(call)
            self._calls[d.index] = call
            self._open = call
            events.append({"type": "response.output_item.added", "output_index": call.index,
                           "item": call.item("in_progress")})
        if d.arguments:
            call.arguments.append(d.arguments)
            events.append({"type": "response.function_call_arguments.delta",
                           "item_id": call.id, "output_index": call.index,
                           "delta": d.arguments})
        return events

    def _close(self, status: str) -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        done = item.item(status)
        self._done[item.index] = done
        if isinstance(item, _Reasoning):
            part = done["content"][0]
            return [{"type": "response.reasoning_text.done", "item_id": item.id,
                     "output_index": item.index, "content_index": 0, "text": part["text"]},
                    {"type": "response.content_part.done", "item_id": item.id,
                     "output_index": item.index, "content_index": 0, "part": part},
                    {"type": "response.output_item.done", "output_index": item.index,
                     "item": done}]
        if isinstance(item, _Message):
            part = done["content"][0]
            return [{"type": "response.output_text.done", "item_id": item.id,
                     "output_index": item.index, "content_index": 0, "text": part["text"],
                     "logprobs": part["logprobs"]},
                    {"type": "response.content_part.done", "item_id": item.id,
                     "output_index": item.index, "content_index": 0, "part": part},
                    {"type": "response.output_item.done", "output_index": item.index,
                     "item": done}]
        return [{"type": "response.function_call_arguments.done", "item_id": item.id,
                 "output_index": item.index, "arguments": done["arguments"]},
                {"type": "response.output_item.done", "output_index": item.index,
                 "item": done}]


class EventCounter:
    """Numbers a stream's events: every event gets the next sequence_number."""

    def __init__(self) -> None:
        self._next = 0

    def number(self, event: dict[str, Any]) -> dict[str, Any]:
        event["sequence_number"] = self._next
        self._next += 1
        return event


def final_body(shape: ResponseShape, builder: OutputBuilder, usage: Usage,
               finish_reason: str | None, timing: ChoiceTiming | None = None
               ) -> dict[str, Any]:
    """The response once its generation ended for `finish_reason`; with `timing` (its
    choice's clock) and metrics on, vLLM's `metrics` object too."""
    if finish_reason == "abort":  # the server aborted it (a drain, /pause): not an answer
        return shape.body("failed", builder.output, usage,
                          error={"code": "server_error",
                                 "message": "The server aborted this response."},
                          reasoning_tokens=builder.reasoning_tokens)
    body = shape.body("incomplete" if finish_reason == "length" else "completed",
                      builder.output, usage, reasoning_tokens=builder.reasoning_tokens)
    if shape.metrics and timing is not None:
        body["metrics"] = metrics_json(timing, usage.completion_tokens)
    return body


def failed_body(shape: ResponseShape, builder: OutputBuilder, message: str) -> dict[str, Any]:
    return shape.body("failed", builder.output,
                      error={"code": "server_error", "message": message})


def abandoned_body(shape: ResponseShape, builder: OutputBuilder, usage: Usage,
                   finish_reason: str | None) -> dict[str, Any]:
    """A stream its client left: what was generated, `incomplete`, unless the generation
    had already finished (only its last events went unread)."""
    if finish_reason is not None:
        return final_body(shape, builder, usage, finish_reason)
    builder.feed("", [], "length")  # closes the open item (a parser's held text too)
    return shape.body("incomplete", builder.output, usage, incomplete_reason=DISCONNECTED,
                      reasoning_tokens=builder.reasoning_tokens)
