"""Reasoning in chat responses: the server's `--reasoning-parser` applied to one request
(`ReasoningPlan`, the request side) and to each of its choices (`ReasoningChoice`, the
response side), as vLLM 0.34 serves it on /v1/chat/completions.

Request side: the parser is built per choice from the request's effective chat-template
kwargs (its own over `--default-chat-template-kwargs`, with `reasoning_effort`'s
`enable_thinking`: what the template saw, so `enable_thinking: false` reads no reasoning)
and the rendered prompt (Qwen3 reads whether the prompt already closed the reasoning).
When any of the parser's markers is a special token of the served tokenizer, the output
keeps special tokens (the detokenizer would drop the markers), as the tool plan does for
its parsers' markers.

Response side: a `ReasoningChoice` wraps the choice state the tool plan made (plain
content, or a tool-call parser). Each delta's text is split first; only the content goes
on to the inner state, so the tool-call parser never sees reasoning (as vLLM orders
them). Streamed, a delta carries `content`, `reasoning` (and `reasoning_content` with
`--reasoning-content-field`) and `tool_calls`, in vLLM's key order, each only when it has
text; a delta whose text is all held back sends nothing unless logprobs or the finish need
the chunk. Whole, the collected deltas are replayed through the same stream, so the
message equals the streamed one. The reasoning-token count is per delta (a delta that
crosses a marker counts as neither side), so it can differ by the few tokens of a marker's
delta between a stream and a whole answer, whose deltas the Outbox may have merged.
`include_reasoning: false` leaves the reasoning out (vLLM's request field); it is still
split off the content.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from actors.params.sampling import SamplingParams

from server.config import ServerConfig
from server.frontend.chat import reasoning
from server.frontend.chat.reasoning import ReasoningParser, ReasoningStream
from server.frontend.chat.render import template_kwargs
from server.frontend.chat.request import ChatRequest
from server.frontend.chat.tool_calls import ChatChoice
from server.frontend.service import ChoiceDelta, ChoiceResult


@dataclass(frozen=True)
class ReasoningPlan:
    """What a request's reasoning parser needs, and what it changes in the output."""

    parser: type[ReasoningParser]
    template_kwargs: Mapping[str, Any]  # what the chat template received
    include_reasoning: bool = True
    reasoning_content: bool = False  # also answer the reasoning as reasoning_content
    keep_special_tokens: bool = False
    tool_frames: bool = False  # the request's tool-call parser reads calls in our framing

    def new_parser(self, prompt: str | None) -> ReasoningParser:
        parser = self.parser(self.template_kwargs, prompt)
        parser.tool_frames = self.tool_frames
        return parser


def plan_reasoning(chat: ChatRequest, config: ServerConfig, *,
                   default_kwargs: Mapping[str, Any] | None, tokenizer: Any,
                   include_reasoning: bool = True,
                   tool_parser: str | None = None) -> ReasoningPlan | None:
    """The request's reasoning plan; None without --reasoning-parser. `tool_parser`: the
    name of the tool-call parser that reads this request's output, if any."""
    if config.reasoning_parser is None:
        return None
    parser = reasoning.get(config.reasoning_parser)
    kwargs = template_kwargs(chat, default_kwargs, config.reasoning_effort_map)
    return ReasoningPlan(parser, kwargs or {},
                         include_reasoning=include_reasoning,
                         reasoning_content=config.reasoning_content_field,
                         keep_special_tokens=markers_are_special(parser.markers, tokenizer),
                         tool_frames=tool_parser in parser.tool_frames_for)


@functools.lru_cache(maxsize=16)
def markers_are_special(markers: tuple[str, ...], tokenizer: Any) -> bool:
    """Whether a marker is one of the tokenizer's special tokens (one that decoding with
    skip_special_tokens leaves out)."""
    if tokenizer is None:
        return False
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    special = {t.content for t in added.values() if getattr(t, "special", False)}
    special.update(getattr(tokenizer, "all_special_tokens", ()) or ())
    return any(m in special for m in markers)


def apply_reasoning(params: SamplingParams, plan: ReasoningPlan | None) -> SamplingParams:
    """The request's SamplingParams with what its reasoning parser changes."""
    if plan is None or not plan.keep_special_tokens or not params.skip_special_tokens:
        return params
    return dataclasses.replace(params, skip_special_tokens=False)


class ReasoningChoice(ChatChoice):
    """One choice whose text a reasoning parser splits before `inner` reads the content."""

    __slots__ = ("_inner", "_parser", "_plan", "_stream")

    def __init__(self, plan: ReasoningPlan, inner: ChatChoice, prompt: str | None) -> None:
        self._plan = plan
        self._inner = inner
        self._parser = plan.new_parser(prompt)
        self._stream: ReasoningStream = self._parser.stream()

    @property
    def reasoning_tokens(self) -> int:
        return self._stream.reasoning_tokens

    def _shown(self, text: str | None) -> dict[str, Any]:
        """The reasoning fields of a delta or message."""
        value = text if self._plan.include_reasoning else None
        fields: dict[str, Any] = {"reasoning": value}
        if self._plan.reasoning_content:
            fields["reasoning_content"] = value
        return fields

    def delta(self, d: ChoiceDelta) -> dict[str, Any] | None:
        thought, content = self._stream.feed(d.text, d.token_ids)
        if d.finish_reason is not None:
            more = self._stream.finish()
            thought, content = thought + more[0], content + more[1]
        inner: dict[str, Any] | None = None
        if content or d.finish_reason is not None:
            inner = self._inner.delta(dataclasses.replace(
                d, text=content, token_ids=d.token_ids if content else []))
        inner = inner or {}
        out: dict[str, Any] = {}
        if "content" in inner:
            out["content"] = inner.pop("content")
        if thought and self._plan.include_reasoning:
            out.update(self._shown(thought))
        out.update(inner)
        return out or None

    def finish_reason(self, reason: str | None) -> str | None:
        return self._inner.finish_reason(reason)

    def message(self, role: str, echoed: str, text: str | None, reason: str | None,
                stop_reason: str | int | None = None) -> tuple[dict[str, Any], str | None]:
        thought, content = self._parser.split(text or "")
        return self._message(role, echoed, thought, content, reason, stop_reason)

    def whole(self, result: ChoiceResult, role: str, echoed: str
              ) -> tuple[dict[str, Any], str | None]:
        pieces = result.pieces or [(result.text, len(result.token_ids))]
        thought: list[str] = []
        content: list[str] = []
        at = 0
        for text, count in pieces:
            r, c = self._stream.feed(text, result.token_ids[at:at + count])
            at += count
            thought.append(r)
            content.append(c)
        r, c = self._stream.finish()
        return self._message(role, echoed, "".join(thought) + r or None,
                             "".join(content) + c or None, result.finish_reason,
                             result.stop_reason)

    def _message(self, role: str, echoed: str, thought: str | None, content: str | None,
                 reason: str | None, stop_reason: str | int | None
                 ) -> tuple[dict[str, Any], str | None]:
        message, reason = self._inner.message(role, echoed, content, reason, stop_reason)
        message.update(self._shown(thought))
        return message, reason


def reasoning_factory(plan: ReasoningPlan | None, inner: Callable[[], ChatChoice],
                      prompt: str | None) -> Callable[[], ChatChoice]:
    """The renderer's per-choice state: `inner` (tool_calls.choice_factory's) as it is
    without a reasoning parser, else wrapped in a ReasoningChoice reading `prompt`."""
    if plan is None:
        return inner
    return lambda: ReasoningChoice(plan, inner(), prompt)
