"""The tool-call parser interface: what a parsed choice looks like, the streaming deltas,
and the per-choice stream that turns growing model text into those deltas.

A parser reads the text a model generated under `tool_choice: "auto"` and splits it into
content and function calls. It does so twice, by two separate readings of the format:

- `parse(text)` decodes a finished text with the strict JSON decoder (or `ast`);
- `scan(text, final)` reads a text that may still be growing and reports only what no
  further text can change: the content so far, and for each call its name once complete
  and the prefix of its arguments that is already certain.

`ToolCallStream` drives `scan` for one choice: each `feed` re-scans the text received so
far and emits what is new since the last scan, `finish` scans the text as final. Keeping
the two readings apart lets the tests check that a streamed choice ends up with the same
content and calls as the same text parsed at once, however the text was split.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from server.api.openai.tool_parsers import _json_scan

logger = logging.getLogger(__name__)


def make_tool_call_id() -> str:
    """A call id in the OpenAI shape: the `chatcmpl-tool-` prefix and 16 hex digits."""
    return f"chatcmpl-tool-{uuid.uuid4().int & (2**64 - 1):016x}"


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments_json: str  # the arguments object as JSON text, as the API carries it
    type: Literal["function"] = "function"

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "function": {"name": self.name, "arguments": self.arguments_json},
        }


@dataclass(frozen=True)
class ParsedToolCalls:
    content: str | None
    calls: list[ToolCall] = field(default_factory=list)

    @property
    def tools_called(self) -> bool:
        return bool(self.calls)


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """One fragment of call `index`. The first fragment of a call carries its id, type
    and name (and any arguments already known); later ones carry argument text only."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    @property
    def type(self) -> Literal["function"] | None:
        return "function" if self.id is not None else None

    def to_openai(self) -> dict[str, Any]:
        """The `delta.tool_calls[]` entry of a chat completion chunk."""
        # vLLM's key order: id and type (first fragment only), index, function.
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"id": self.id, "type": "function", "index": self.index,
                "function": {"name": self.name, "arguments": self.arguments}}


Delta = ContentDelta | ToolCallDelta


@dataclass
class CallProgress:
    """What a scan knows of one call: its name once complete (a call is not announced
    before), the certain prefix of its arguments, whether the arguments are complete."""

    name: str | None
    arguments: str = ""
    complete: bool = False


@dataclass
class Scan:
    content: str = ""
    calls: list[CallProgress] = field(default_factory=list)
    # The text cannot be tool calls: `content` is then the whole text as content.
    invalid: bool = False


def partial_overlap(text: str, tag: str) -> int:
    """Length of the longest proper prefix of `tag` that ends `text`: that much of the
    text must be held back, since it may be the start of the tag."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


class ToolParser:
    """One model family's tool-call format. Stateless: one instance serves every
    request; per-choice streaming state lives in the `ToolCallStream` it makes."""

    name: ClassVar[str] = ""
    # The format's markers are special tokens: the detokenizer must keep them.
    keeps_special_tokens: ClassVar[bool] = False

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        self.tools = tools or []

    def make_call_id(self) -> str:
        return make_tool_call_id()

    def parse(self, text: str) -> ParsedToolCalls:
        """Content and calls of a finished text. Never raises: output that does not
        follow the format is returned whole as content."""
        try:
            return self._parse(text)
        except Exception:
            logger.exception("%s tool parser failed; returning the text as content", self.name)
            return ParsedToolCalls(content=text)

    def scan(self, text: str, final: bool) -> Scan:
        """The prefix-stable reading of `text`; `final` when no more text will come."""
        try:
            return self._scan(text, final)
        except Exception:
            logger.exception("%s tool parser scan failed", self.name)
            return Scan(content=text, invalid=True)
        finally:
            _json_scan.clear_caches()

    def new_stream(self) -> ToolCallStream:
        return ToolCallStream(self)

    def _parse(self, text: str) -> ParsedToolCalls:
        raise NotImplementedError

    def _scan(self, text: str, final: bool) -> Scan:
        raise NotImplementedError

    def _calls(self, pairs: list[tuple[str, str]]) -> list[ToolCall]:
        return [ToolCall(self.make_call_id(), name, arguments) for name, arguments in pairs]


def content_or_none(content: str, has_calls: bool) -> str | None:
    """Content beside calls: none when it is only whitespace (a template's newline before
    the first call is not a message)."""
    if has_calls and not content.strip():
        return None
    return content if content or not has_calls else None


@dataclass
class _SentCall:
    id: str
    arguments: str


class ToolCallStream:
    """The streaming state of one choice."""

    def __init__(self, parser: ToolParser) -> None:
        self._parser = parser
        self._text = ""
        self._content = ""
        self._calls: list[_SentCall] = []
        self._finished = False

    @property
    def text(self) -> str:
        return self._text

    @property
    def call_ids(self) -> list[str]:
        return [call.id for call in self._calls]

    @property
    def tools_called(self) -> bool:
        return bool(self._calls)

    def feed(self, delta_text: str) -> list[Delta]:
        """The deltas the new text makes certain (often none: a tag or a name that has
        only begun is held back)."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        if not delta_text:
            return []
        self._text += delta_text
        return self._advance(final=False)

    def finish(self) -> list[Delta]:
        """The rest, once the choice has ended: held-back text, or content when the
        output turned out not to be tool calls."""
        if self._finished:
            return []
        self._finished = True
        return self._advance(final=True)

    def _advance(self, final: bool) -> list[Delta]:
        scan = self._parser.scan(self._text, final)
        deltas: list[Delta] = []
        if scan.invalid and self._calls:
            # Calls already sent cannot be taken back: the stream stops where the
            # output left the format.
            return deltas
        content = scan.content
        if not final and not content.strip():
            # Whitespace before a first call is dropped at the end, so it waits.
            content = ""
        if len(content) > len(self._content) and content.startswith(self._content):
            deltas.append(ContentDelta(content[len(self._content) :]))
            self._content = content
        for index, call in enumerate(scan.calls):
            if call.name is None:
                break
            if index == len(self._calls):
                sent = _SentCall(self._parser.make_call_id(), call.arguments)
                self._calls.append(sent)
                deltas.append(ToolCallDelta(index, call.arguments, sent.id, call.name))
                continue
            sent = self._calls[index]
            if len(call.arguments) > len(sent.arguments) and call.arguments.startswith(
                sent.arguments
            ):
                deltas.append(ToolCallDelta(index, call.arguments[len(sent.arguments) :]))
                sent.arguments = call.arguments
        return deltas
