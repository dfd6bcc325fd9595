"""The tool-call parser interface: what a parsed choice looks like, the streaming deltas,
and the per-choice stream that turns growing model text into those deltas.

A parser reads the text a model generated under `tool_choice: "auto"` and splits it into
content and function calls. It does so twice, by two separate readings of the format:

- `parse(text)` decodes a finished text with the strict JSON decoder (or `ast`);
- a `Scanner` reads a text that may still be growing and reports only what no further
  text can change: the content so far, and for each call its name once complete and the
  prefix of its arguments that is already certain.

`ToolCallStream` drives one scanner per choice: each `feed` appends the delta and the
scanner reads on from where it stopped (it keeps its place, so a choice costs time in
proportion to its length, not its length squared); what is new since the last delta goes
out; `finish` reads the text as final. Keeping the two readings apart lets the tests check
that a streamed choice ends up with the same content and calls as the same text parsed at
once, however the text was split.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

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
    before), the certain prefix of its arguments, whether the arguments are complete.

    Arguments that are a stretch of the text itself are given as `span`, its (start, end),
    instead of `arguments`: a streamed call's arguments grow with every token, and
    copying them each time would cost their length per token."""

    name: str | None
    arguments: str = ""
    complete: bool = False
    span: tuple[int, int] | None = None

    def arguments_in(self, text: str) -> str:
        if self.span is None:
            return self.arguments
        return text[self.span[0] : self.span[1]]


@dataclass
class Scan:
    """A scanner's reading of the text so far. The content is `text[:content_end]` when
    `content_end` is set, else `content`; the calls are `calls` (the scanner's own list,
    shared rather than copied on every token), then `open_call` if there is one."""

    content: str = ""
    calls: Sequence[CallProgress] = ()
    # The text cannot be tool calls: the content is then the whole text (Mistral's: without
    # its markers).
    invalid: bool = False
    content_end: int | None = None
    open_call: CallProgress | None = None


class Scanner:
    """The reading of one choice's growing text. `advance(text, final)` is given the whole
    text each time (the text read before, grown), reads what arrived since the last call,
    and reports the content and calls it makes certain; `final` when no more text will
    come. A scanner that fails stays failed: the text is content from then on."""

    def __init__(self, parser_name: str) -> None:
        self._parser_name = parser_name
        self._failed = False

    def advance(self, text: str, final: bool) -> Scan:
        if not self._failed:
            try:
                return self._advance(text, final)
            except Exception:
                logger.exception("%s tool parser scan failed", self._parser_name)
                self._failed = True
        return Scan(content_end=len(text), invalid=True)

    def _advance(self, text: str, final: bool) -> Scan:
        raise NotImplementedError


def partial_overlap(text: str, tag: str) -> int:
    """Length of the longest proper prefix of `tag` that ends `text`: that much of the
    text must be held back, since it may be the start of the tag."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


class TaggedScanner(Scanner):
    """A format whose calls follow a tag (Hermes' `<tool_call>`, Mistral's `[TOOL_CALLS]`):
    until the first tag the text is content, less what may be the tag's start at its end;
    from the tag on, the format's `_read` reads the calls. `_pos` is where the search for
    the next tag (or the format's reading) goes on."""

    def __init__(self, parser_name: str, tag: str) -> None:
        super().__init__(parser_name)
        self._tag = tag
        self._first = -1  # the first tag
        self._pos = 0

    def _advance(self, text: str, final: bool) -> Scan:
        if self._first < 0:
            first = self._find_tag(text)
            if first < 0:
                held = 0 if final else partial_overlap(text, self._tag)
                return Scan(content_end=len(text) - held)
            self._first, self._pos = first, first + len(self._tag)
        return self._read(text, final)

    def _read(self, text: str, final: bool) -> Scan:
        raise NotImplementedError

    def _find_tag(self, text: str) -> int:
        """The next tag at or after `_pos`, or -1, `_pos` then moved past the text that
        cannot hold the start of one."""
        found = text.find(self._tag, self._pos)
        if found < 0:
            self._pos = max(self._pos, len(text) - len(self._tag) + 1)
        return found

    def _with_calls(self, text: str, final: bool, calls: Sequence[CallProgress],
                    open_call: CallProgress | None) -> Scan:
        """The calls beside the content before the first tag (at the end, none when it is
        only whitespace)."""
        first = self._first
        if final and not content_or_none(text[:first], True):
            first = 0
        return Scan(content_end=first, calls=calls, open_call=open_call)


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

    @classmethod
    def call_tags(cls, function: str) -> list[tuple[str, str, str]] | None:
        """How a call to `function` is written, for a strict tool's structural tag:
        (trigger, begin, end) per spelling, the JSON arguments between begin and end;
        None when the format has no such spelling (`strict` is then ignored)."""
        return None

    def parse(self, text: str) -> ParsedToolCalls:
        """Content and calls of a finished text. Never raises: output that does not
        follow the format is returned whole as content."""
        try:
            return self._parse(text)
        except Exception:
            logger.exception("%s tool parser failed; returning the text as content", self.name)
            return ParsedToolCalls(content=text)

    def new_scanner(self) -> Scanner:
        """A scanner for one growing text."""
        raise NotImplementedError

    def new_stream(self) -> ToolCallStream:
        return ToolCallStream(self)

    def _parse(self, text: str) -> ParsedToolCalls:
        raise NotImplementedError

    def _calls(self, pairs: list[tuple[str, str]]) -> list[ToolCall]:
        return [ToolCall(self.make_call_id(), name, arguments) for name, arguments in pairs]


def content_or_none(content: str, has_calls: bool) -> str | None:
    """Content beside calls: none when it is only whitespace (a template's newline before
    the first call is not a message)."""
    if has_calls and not content.strip():
        return None
    return content if content or not has_calls else None


_NOT_SPACE = re.compile(r"\S")


@dataclass
class _SentCall:
    """What went out of one call: its arguments, as a span of the text when they were one."""

    id: str
    arguments: str
    span: tuple[int, int] | None
    length: int


class ToolCallStream:
    """The streaming state of one choice."""

    def __init__(self, parser: ToolParser) -> None:
        self._parser = parser
        self._scanner = parser.new_scanner()
        self._text = ""
        # The content sent: text[:_content_end], or _content when _content_end is None.
        self._content = ""
        self._content_end: int | None = 0
        self._calls: list[_SentCall] = []
        self._settled = 0  # calls complete and sent in full: nothing more can come for them
        self._first_char: int | None = None  # the text's first non-whitespace character
        self._spaces_to = 0  # the text before this is whitespace
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
        # Dropping the attribute's reference first lets CPython grow the string in place
        # rather than copy the whole text on every delta.
        text = self._text
        self._text = ""
        text += delta_text
        self._text = text
        return self._advance(final=False)

    def finish(self) -> list[Delta]:
        """The rest, once the choice has ended: held-back text, or content when the
        output turned out not to be tool calls."""
        if self._finished:
            return []
        self._finished = True
        return self._advance(final=True)

    def _advance(self, final: bool) -> list[Delta]:
        text = self._text
        scan = self._scanner.advance(text, final)
        deltas: list[Delta] = []
        if scan.invalid and self._calls:
            # Calls already sent cannot be taken back: the stream stops where the
            # output left the format.
            return deltas
        self._send_content(text, scan, final, deltas)
        calls = scan.calls
        count = len(calls) + (scan.open_call is not None)
        for index in range(self._settled, count):
            call = calls[index] if index < len(calls) else scan.open_call
            assert call is not None
            if call.name is None:
                break
            if index == len(self._calls):
                arguments = call.arguments_in(text)
                sent = _SentCall(self._parser.make_call_id(), arguments, call.span,
                                 len(arguments))
                self._calls.append(sent)
                deltas.append(ToolCallDelta(index, arguments, sent.id, call.name))
            else:
                self._send_arguments(text, index, call, deltas)
            if call.complete and index == self._settled:
                self._settled += 1
        return deltas

    def _send_content(self, text: str, scan: Scan, final: bool, deltas: list[Delta]) -> None:
        end = scan.content_end
        if end is not None:
            if not final and not self._has_content(text, end):
                # Whitespace before a first call is dropped at the end, so it waits.
                end = 0
            if self._content_end is not None:
                if end > self._content_end:
                    deltas.append(ContentDelta(text[self._content_end : end]))
                    self._content_end = end
                return
            content = text[:end]
        else:
            content = scan.content
            if not content or (not final and not content.strip()):
                return
        sent = self._content if self._content_end is None else text[: self._content_end]
        if len(content) > len(sent) and content.startswith(sent):
            deltas.append(ContentDelta(content[len(sent) :]))
            self._content, self._content_end = content, end

    def _has_content(self, text: str, end: int) -> bool:
        """Whether text[:end] holds more than whitespace."""
        if self._first_char is None:
            found = _NOT_SPACE.search(text, self._spaces_to)
            if found is None:
                self._spaces_to = len(text)
                return False
            self._first_char = found.start()
        return self._first_char < end

    def _send_arguments(self, text: str, index: int, call: CallProgress,
                        deltas: list[Delta]) -> None:
        sent = self._calls[index]
        span = call.span
        length = len(call.arguments) if span is None else span[1] - span[0]
        if length <= sent.length:
            return
        if span is not None and sent.span is not None and span[0] == sent.span[0]:
            delta = text[sent.span[1] : span[1]]
        else:
            arguments = call.arguments_in(text)
            before = sent.arguments if sent.span is None else text[sent.span[0] : sent.span[1]]
            if not arguments.startswith(before):
                return
            delta = arguments[len(before) :]
        deltas.append(ToolCallDelta(index, delta))
        sent.arguments, sent.span, sent.length = call.arguments, span, length
