"""Formats whose calls sit between markers, each call a header that names the function and
a body that holds its arguments (DeepSeek V3 and V3.1, Qwen3-Coder's XML), read by one
resumable scanner.

A `Frame` describes the markers: the one that opens the calls (the content is the text
before it), the one before each call, the one that ends a call's header, those expected
after its body, and an optional one that closes all calls. A `Body` reads the arguments:
`JsonBody` a JSON object, streamed as its raw text; a format may bring its own.

The same scanner reads a finished text (`FramedToolParser.parse` runs it once with
`final`), so a streamed choice and the same text read whole take one reading of the
format; what stays to check is that the reading resumes right wherever a delta ends.

What is kept: the text before the opening marker is the content (none when only
whitespace); text between calls, and after the closing marker, is dropped; a call whose
closing markers never came (the model stopped on its end token) counts when its body is
complete. Output after the opening marker that holds no complete call is returned whole as
content; once a call is complete, what follows that is not a call ends the calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from server.frontend.chat.tool_parsers import _json_scan as js
from server.frontend.chat.tool_parsers.base import (
    CallProgress,
    ParsedToolCalls,
    Scan,
    Scanner,
    ToolCall,
    ToolParser,
    content_or_none,
    partial_overlap,
)


@dataclass(frozen=True)
class Frame:
    opener: str  # ends the content; the first call's `call_begin` too when they are equal
    call_begin: str
    header_end: str
    closers: tuple[str, ...]  # after the body, whitespace allowed before each
    calls_end: str | None = None
    # The function name in a header (the text between `call_begin` and `header_end`);
    # None when the header is not one.
    name_of: Callable[[str], str | None] = lambda header: header.strip() or None


@dataclass
class BodyState:
    progress: CallProgress | None  # the arguments so far (the name is filled in later)
    end: int | None  # just past the body once complete
    bad: bool = False


class Body:
    """The arguments of one call to the function it was made for, `Body(start, name)`,
    from `start` of a growing text."""

    def advance(self, text: str, final: bool) -> BodyState:
        raise NotImplementedError


class JsonBody(Body):
    """A JSON object (after optional whitespace), streamed as its raw text, which is also
    the call's arguments once complete."""

    def __init__(self, start: int, name: str = "") -> None:
        self._pos = start
        self._value: js.JsonValue | None = None

    def advance(self, text: str, final: bool) -> BodyState:
        if self._value is None:
            self._pos = js.skip_ws(text, self._pos)
            if self._pos >= len(text):
                return BodyState(None, None, bad=final)
            if text[self._pos] != "{":
                return BodyState(None, None, bad=True)
            self._value = js.JsonValue(self._pos)
        value = self._value
        value.advance(text)
        if value.bad or (final and value.end is None):
            return BodyState(None, None, bad=True)
        if value.end is None:
            return BodyState(CallProgress(None, span=(value.start, len(text))), None)
        return BodyState(CallProgress(None, complete=True, span=(value.start, value.end)),
                         value.end)


# Where the reading stands.
_CONTENT, _BETWEEN, _HEADER, _BODY, _CLOSERS, _DONE = range(6)


class FramedScanner(Scanner):
    def __init__(self, parser_name: str, frame: Frame,
                 body: Callable[[int, str], Body]) -> None:
        super().__init__(parser_name)
        self._frame = frame
        self._new_body = body
        self._stage = _CONTENT
        self._pos = 0
        self._first = -1  # where the opening marker starts
        self._calls: list[CallProgress] = []
        self._name: str | None = None
        self._body: Body | None = None
        self._closer = 0  # the closer expected next

    def _advance(self, text: str, final: bool) -> Scan:
        frame = self._frame
        size = len(text)
        open_call: CallProgress | None = None
        while True:
            if self._stage == _CONTENT:
                found = text.find(frame.opener, self._pos)
                if found < 0:
                    self._pos = max(self._pos, size - len(frame.opener) + 1)
                    held = 0 if final else partial_overlap(text, frame.opener)
                    return Scan(content_end=size - held)
                self._first = found
                if frame.opener == frame.call_begin:
                    self._stage, self._pos = _HEADER, found + len(frame.opener)
                else:
                    self._stage, self._pos = _BETWEEN, found + len(frame.opener)
            if self._stage == _BETWEEN and not self._next_call(text, final):
                break
            if self._stage == _HEADER:
                end = text.find(frame.header_end, self._pos)
                if end < 0:
                    if final:
                        return self._cut(text)
                    break
                name = frame.name_of(text[self._pos : end])
                if name is None:
                    return self._cut(text)
                self._name, self._stage = name, _BODY
                self._body = self._new_body(end + len(frame.header_end), name)
            if self._stage == _BODY:
                assert self._body is not None
                state = self._body.advance(text, final)
                if state.bad:
                    return self._cut(text)
                if state.progress is not None:
                    state.progress.name = self._name
                if state.end is None:
                    open_call = state.progress
                    break
                assert state.progress is not None
                self._calls.append(state.progress)
                self._stage, self._pos, self._closer = _CLOSERS, state.end, 0
            if self._stage == _CLOSERS and not self._read_closers(text, final):
                break
            if self._stage == _DONE:
                break
        return self._scan(text, final, open_call)

    def _next_call(self, text: str, final: bool) -> bool:
        """Moves past the next call's marker (False: none yet, or the calls ended)."""
        frame = self._frame
        begin = text.find(frame.call_begin, self._pos)
        end = text.find(frame.calls_end, self._pos) if frame.calls_end else -1
        if end >= 0 and (begin < 0 or end < begin):
            self._stage = _DONE
            return False
        if begin < 0:
            longest = max(len(frame.call_begin), len(frame.calls_end or ""))
            self._pos = max(self._pos, len(text) - longest + 1)
            return False
        self._stage, self._pos = _HEADER, begin + len(frame.call_begin)
        return True

    def _read_closers(self, text: str, final: bool) -> bool:
        """Moves past the closers that follow a body (False: not all there yet)."""
        closers = self._frame.closers
        while self._closer < len(closers):
            closer = closers[self._closer]
            at = js.skip_ws(text, self._pos)
            if text.startswith(closer, at):
                self._pos, self._closer = at + len(closer), self._closer + 1
                continue
            rest = text[at:]
            if at < len(text) and not (not final and closer.startswith(rest)):
                self._stage = _DONE  # not a closer: the calls end here
                return False
            self._pos = at
            return False
        self._stage = _BETWEEN
        return True

    def _cut(self, text: str) -> Scan:
        """A call that cannot be read: the calls end before it, or, with none complete,
        the whole text is content."""
        if not self._calls:
            return Scan(content_end=len(text), invalid=True)
        self._stage = _DONE
        return self._scan(text, True, None)

    def _scan(self, text: str, final: bool, open_call: CallProgress | None) -> Scan:
        first = self._first
        if final and not self._calls:
            return Scan(content_end=len(text), invalid=True)
        if final and not content_or_none(text[:first], True):
            first = 0
        return Scan(content_end=first, calls=self._calls, open_call=open_call)


class FramedToolParser(ToolParser):
    """A parser whose whole reading is its scanner's, run once over the finished text."""

    keeps_special_tokens = True

    def _parse(self, text: str) -> ParsedToolCalls:
        scan = self.new_scanner().advance(text, final=True)
        return scan_result(self, text, scan)


def scan_result(parser: ToolParser, text: str, scan: Scan) -> ParsedToolCalls:
    """The content and calls of a final scan."""
    if scan.invalid:
        return ParsedToolCalls(content=text)
    content = text[: scan.content_end] if scan.content_end is not None else scan.content
    calls: list[ToolCall] = [
        ToolCall(parser.make_call_id(), call.name, call.arguments_in(text))
        for call in scan.calls if call.name is not None
    ]
    return ParsedToolCalls(content_or_none(content, bool(calls)), calls)

