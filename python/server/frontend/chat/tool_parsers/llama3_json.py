"""The Llama 3.x / 4 JSON format (`llama3_json`, alias `llama4_json`): the reply is one or
more JSON objects `{"name": ..., "parameters": {...}}` (or `"arguments"`), usually
separated by `;`, optionally preceded by `<|python_tag|>`.

What is kept: calls are recognised when the reply opens (after whitespace) with
`<|python_tag|>` or `{`, as vLLM's streaming path recognises them; a reply opening with
prose is content. vLLM's non-streaming path also extracts objects from the middle of
prose; that cannot be streamed without holding back every `{` in ordinary text, and it
turns JSON quoted in an answer into a call, so both paths here follow the streaming rule.
Once calls are found there is no content: text between and after the objects is
dropped. If the first object is not a call the whole text is content; a later object
that is not a call ends the list (it and what follows are dropped).

`<|python_tag|>` is a special token: the detokenizer must keep special tokens for it.
"""

from __future__ import annotations

import json

from server.frontend.chat.tool_parsers import _json_scan as js
from server.frontend.chat.tool_parsers._json_calls import CallScanner, CallShape, decode_call
from server.frontend.chat.tool_parsers.base import (
    CallProgress,
    ParsedToolCalls,
    Scan,
    Scanner,
    ToolParser,
)

PYTHON_TAG = "<|python_tag|>"
_SHAPE = CallShape(argument_keys=("arguments", "parameters"))


def _calls_start(text: str, final: bool) -> int | None:
    """Where the first object starts: -1 when the text is prose, None while it cannot
    tell yet (only whitespace, or part of the tag)."""
    index = js.skip_ws(text, 0)
    rest = text[index:]
    if rest.startswith(PYTHON_TAG):
        index = js.skip_ws(text, index + len(PYTHON_TAG))
        if index < len(text):
            return index if text[index] == "{" else -1
        return -1 if final else None
    if rest.startswith("{"):
        return index
    if not final and PYTHON_TAG.startswith(rest):
        return None
    return -1


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"

    @classmethod
    def call_tags(cls, function: str) -> list[tuple[str, str, str]]:
        head = '{"name": '
        return [(head, head + json.dumps(function, ensure_ascii=False) + ', "parameters": ',
                 "}")]

    def _parse(self, text: str) -> ParsedToolCalls:
        start = _calls_start(text, True)
        if start is None or start < 0:
            return ParsedToolCalls(content=text)
        pairs: list[tuple[str, str]] = []
        while start >= 0:
            try:
                obj, end = js.raw_decode_strict(text, start)
            except ValueError:
                obj, end = None, start
            call = decode_call(obj, _SHAPE)
            if call is None:
                if not pairs:
                    return ParsedToolCalls(content=text)
                break
            pairs.append(call)
            start = text.find("{", end)
        return ParsedToolCalls(content=None, calls=self._calls(pairs))

    def new_scanner(self) -> Scanner:
        return _Llama3JsonScanner(self.name)


class _Llama3JsonScanner(Scanner):
    """Finished objects are kept as calls; only the current object, or the text before
    the next `{`, is read on."""

    def __init__(self, parser_name: str) -> None:
        super().__init__(parser_name)
        self._start: int | None = None  # where the first object starts, -1 for prose
        self._call: CallScanner | None = None
        self._pos = 0  # where the next `{` is looked for, between objects
        self._calls: list[CallProgress] = []

    def _advance(self, text: str, final: bool) -> Scan:
        if self._start is None:
            self._start = _calls_start(text, final)
            if self._start is None:
                return Scan()
            self._pos = self._start
        if self._start < 0:
            return Scan(content_end=len(text))
        while True:
            if self._call is None:
                start = text.find("{", self._pos)
                if start < 0:
                    self._pos = len(text)
                    return Scan(calls=self._calls)
                self._call = CallScanner(start, _SHAPE)
            call = self._call.advance(text, final)
            if call.bad:
                if not self._calls:
                    return Scan(content_end=len(text), invalid=True)
                return Scan(calls=self._calls)  # an object that is no call ends the list
            if call.end is None:
                return Scan(calls=self._calls, open_call=call.progress)
            assert call.progress is not None
            self._calls.append(call.progress)
            self._call, self._pos = None, call.end
