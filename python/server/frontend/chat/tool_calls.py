"""Tool calls in chat responses, the response side: the per-choice state that runs a
request's tool-call parser over the choice's text, streamed or whole.

Streamed, each text delta goes to the choice's `ToolCallStream`; what it makes certain
goes out as `delta.content` and `delta.tool_calls` (the first fragment of a call with its
id, type and name, later ones with argument text only); nothing goes out while a marker or
a name is still incomplete. Whole, the text is parsed once. Either way, as vLLM:

- `parallel_tool_calls: false` keeps the first call only;
- `finish_reason` is `tool_calls` when calls were made and generation stopped on its own,
  except for a named function (`stop`, as OpenAI reports it); a `length` cut stays `length`;
- a forced choice ("required", named) has content "" beside its calls; a named call cut by
  max_tokens, whose arguments are not JSON, is not returned as a call.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from server.frontend.chat.tool_parsers import ContentDelta, Delta, ToolCallDelta
from server.frontend.chat.tools import ToolPlan
from server.frontend.service import ChoiceDelta, ChoiceResult


def chat_message(role: str, content: str | None,
                 tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    # vLLM's shape: tool_calls is left out when there are none; the rest are null.
    message = {"role": role, "content": content, "refusal": None, "annotations": None,
               "audio": None, "function_call": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    message["reasoning"] = None
    return message


class ChatChoice:
    """One choice of a chat response. Its text becomes message content as it is; a
    tool-call parser (tool_calls.ToolCallChoice) keeps here what it has seen of the choice
    and splits the text into content and tool calls."""

    __slots__ = ()

    def delta(self, d: ChoiceDelta) -> dict[str, Any] | None:
        """The chunk's delta; None when nothing may go out yet."""
        # A token whose text is held back still gets its chunk (content "", its logprobs),
        # as vLLM sends it; a finish without any token has an empty delta.
        return {"content": d.text} if d.text or d.token_ids else {}

    def finish_reason(self, reason: str | None) -> str | None:
        """The chunk's finish_reason, once delta() has seen the choice's last delta."""
        return reason

    def message(self, role: str, echoed: str, text: str | None, reason: str | None,
                stop_reason: str | int | None = None) -> tuple[dict[str, Any], str | None]:
        """The whole choice's message and finish_reason. `text` None: the choice has no
        content (a reasoning parser took all of it)."""
        if text is None:
            return chat_message(role, echoed or None), reason
        return chat_message(role, echoed + text), reason

    def whole(self, result: ChoiceResult, role: str, echoed: str
              ) -> tuple[dict[str, Any], str | None]:
        """`message` of a collected choice (a reasoning choice reads it delta by delta)."""
        return self.message(role, echoed, result.text, result.finish_reason,
                            result.stop_reason)

    @property
    def reasoning_tokens(self) -> int:
        """The choice's tokens of reasoning so far (none without a reasoning parser)."""
        return 0


def choice_factory(plan: ToolPlan) -> Callable[[], ChatChoice]:
    """The renderer's per-choice state for a request's tool plan. (With special tokens
    kept, the end token's text never reaches it: the detokenizer leaves it out.)"""
    if plan.parser is None:
        return ChatChoice
    return lambda: ToolCallChoice(plan)


def _finish_reason(reason: str | None, called: bool, named: bool) -> str | None:
    if called and reason == "stop" and not named:
        return "tool_calls"
    return reason


class ToolCallChoice(ChatChoice):
    """One choice whose text a tool-call parser reads."""

    __slots__ = ("_called", "_plan", "_stream")

    def __init__(self, plan: ToolPlan) -> None:
        assert plan.parser is not None
        self._plan = plan
        self._stream = plan.parser.new_stream()
        self._called = False

    def _keeps(self, delta: Delta) -> bool:
        return not (isinstance(delta, ToolCallDelta) and delta.index > 0
                    and self._plan.parallel_tool_calls is False)

    def delta(self, d: ChoiceDelta) -> dict[str, Any] | None:
        text = d.text
        deltas = self._stream.feed(text) if text else []
        if d.finish_reason is not None:
            deltas += self._stream.finish()
        content = "".join(x.text for x in deltas if isinstance(x, ContentDelta))
        calls = [x.to_openai() for x in deltas
                 if isinstance(x, ToolCallDelta) and self._keeps(x)]
        if not content and not calls:
            return None
        self._called = self._called or bool(calls)
        out: dict[str, Any] = {}
        if content:
            out["content"] = content
        if calls:
            out["tool_calls"] = calls
        return out

    def finish_reason(self, reason: str | None) -> str | None:
        return _finish_reason(reason, self._called, self._plan.named)

    def message(self, role: str, echoed: str, text: str | None, reason: str | None,
                stop_reason: str | int | None = None) -> tuple[dict[str, Any], str | None]:
        assert self._plan.parser is not None
        parsed = self._plan.parser.parse(text or "")
        calls = parsed.calls
        if self._plan.parallel_tool_calls is False:
            calls = calls[:1]
        if self._plan.named and reason == "length" and calls and not is_json(
                calls[0].arguments_json):
            calls = []
        content = parsed.content
        if self._plan.forced:
            content = content or ""
        if echoed:
            content = echoed + (content or "")
        tool_calls = [call.to_openai() for call in calls]
        return (chat_message(role, content, tool_calls),
                _finish_reason(reason, bool(calls), self._plan.named))


def is_json(text: str) -> bool:
    """Whether a call's arguments text decodes (a named call cut by max_tokens may not)."""
    try:
        json.loads(text)
    except (ValueError, RecursionError):  # nested past the decoder's depth: no client's either
        return False
    return True
