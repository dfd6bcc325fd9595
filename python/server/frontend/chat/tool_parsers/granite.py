"""IBM Granite's tool calls (`granite`, as vLLM registers it): a JSON array of
`{"name": ..., "arguments": {...}}` after a marker, `<|tool_call|>` (Granite 3.0, a special
token) or `<tool_call>` (3.1 and later, plain text):

    <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]

The text before the marker is the content (none when only whitespace); the array has no
closing marker, and text after it is dropped; an object without `arguments` is a call
with `{}`. An array cut short (by max_tokens) keeps its complete calls; output after the
marker that holds none is returned whole as content.
"""

from __future__ import annotations

from server.frontend.chat.tool_parsers._framed import FramedToolParser
from server.frontend.chat.tool_parsers._json_calls import CallShape
from server.frontend.chat.tool_parsers.base import Scan, Scanner, content_or_none, partial_overlap
from server.frontend.chat.tool_parsers.tool_schema import ArrayCallsScanner

MARKERS = ("<|tool_call|>", "<tool_call>")
_SHAPE = CallShape(argument_keys=("arguments",), missing_arguments="{}")


class GraniteToolParser(FramedToolParser):
    name = "granite"

    def new_scanner(self) -> Scanner:
        return _GraniteScanner(self.name)


class _GraniteScanner(Scanner):
    def __init__(self, parser_name: str) -> None:
        super().__init__(parser_name)
        self._pos = 0  # where the search for a marker goes on
        self._first = -1
        self._array: ArrayCallsScanner | None = None

    def _advance(self, text: str, final: bool) -> Scan:
        if self._array is None:
            found = [(at, marker) for marker in MARKERS
                     if (at := text.find(marker, self._pos)) >= 0]
            if not found:
                self._pos = max(self._pos, len(text) - max(map(len, MARKERS)) + 1)
                held = 0 if final else max(partial_overlap(text, m) for m in MARKERS)
                return Scan(content_end=len(text) - held)
            self._first, marker = min(found)
            self._array = ArrayCallsScanner(self._parser_name, None, _SHAPE,
                                            start=self._first + len(marker), strict=False)
        scan = self._array.advance(text, final)
        if scan.invalid:
            return Scan(content_end=len(text), invalid=True)
        first = self._first
        if final and not content_or_none(text[:first], True):
            first = 0
        return Scan(content_end=first, calls=scan.calls, open_call=scan.open_call)
