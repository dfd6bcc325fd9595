"""The Hermes format (Hermes 2 Pro/3, Qwen 2.5 and the many templates that copied it):
each call is a JSON object `{"name": ..., "arguments": {...}}` between `<tool_call>` and
`</tool_call>`, one block per call.

What is kept, as vLLM's `hermes` parser keeps it: the text before the first
`<tool_call>` is the content (none when only whitespace); text between and after the
blocks is dropped; a last block may lack its closing tag (the model stopped on its end
token). If any block does not hold a call object, the whole text is content.

One difference: a block's object is read as JSON, so `</tool_call>` inside an argument
string does not end the block.

The tags are special tokens in these models' vocabularies, so the detokenizer must keep
special tokens for requests with tools.
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
    TaggedScanner,
    ToolParser,
    content_or_none,
)

START = "<tool_call>"
END = "</tool_call>"
_SHAPE = CallShape(argument_keys=("arguments",))


class HermesToolParser(ToolParser):
    name = "hermes"
    keeps_special_tokens = True

    @classmethod
    def call_tags(cls, function: str) -> list[tuple[str, str, str]]:
        # The block on lines of its own, as the templates write it, or on one line.
        head = '{"name": ' + json.dumps(function, ensure_ascii=False) + ', "arguments": '
        return [(START, f"{START}\n{head}", "}\n" + END), (START, START + head, "}" + END)]

    def _parse(self, text: str) -> ParsedToolCalls:
        first = text.find(START)
        if first < 0:
            return ParsedToolCalls(content=text)
        pairs: list[tuple[str, str]] = []
        start = first
        while start >= 0:
            index = js.skip_ws(text, start + len(START))
            try:
                obj, end = js.raw_decode_strict(text, index)
            except ValueError:
                return ParsedToolCalls(content=text)
            call = decode_call(obj, _SHAPE)
            if call is None:
                return ParsedToolCalls(content=text)
            pairs.append(call)
            after = js.skip_ws(text, end)
            if text.startswith(END, after):
                after += len(END)
            elif after < len(text):
                return ParsedToolCalls(content=text)
            start = text.find(START, after)
        return ParsedToolCalls(content_or_none(text[:first], True), self._calls(pairs))

    def new_scanner(self) -> Scanner:
        return _HermesScanner(self.name)


# Where the reading of the current block stands.
_OPEN_TAG, _IN_CALL, _AFTER_CALL, _BETWEEN = range(4)


class _HermesScanner(TaggedScanner):
    """The blocks read so far are kept as finished calls; only the current block (its
    opening tag, its object, its closing tag, or the text before the next block) is read
    on."""

    def __init__(self, parser_name: str) -> None:
        super().__init__(parser_name, START)
        self._stage = _OPEN_TAG
        self._call: CallScanner | None = None
        self._calls: list[CallProgress] = []  # the calls of finished blocks

    def _read(self, text: str, final: bool) -> Scan:
        size = len(text)
        open_call = None
        while True:
            if self._stage == _OPEN_TAG:
                index = js.skip_ws(text, self._pos)
                self._pos = index
                if index >= size:
                    if final:
                        return Scan(content_end=size, invalid=True)
                    break
                if text[index] != "{":
                    return Scan(content_end=size, invalid=True)
                self._call, self._stage = CallScanner(index, _SHAPE), _IN_CALL
            if self._stage == _IN_CALL:
                assert self._call is not None
                call = self._call.advance(text, final)
                if call.bad:
                    return Scan(content_end=size, invalid=True)
                if call.end is None:
                    open_call = call.progress
                    break
                assert call.progress is not None
                self._calls.append(call.progress)
                self._call, self._stage, self._pos = None, _AFTER_CALL, call.end
            if self._stage == _AFTER_CALL:
                after = js.skip_ws(text, self._pos)
                self._pos = after
                if text.startswith(END, after):
                    self._stage, self._pos = _BETWEEN, after + len(END)
                elif after < size and not (
                    not final and size - after < len(END) and END.startswith(text[after:])
                ):
                    return Scan(content_end=size, invalid=True)
                else:
                    break  # the closing tag may still come
            start = self._find_tag(text)
            if start < 0:
                break
            self._stage, self._pos = _OPEN_TAG, start + len(START)
        return self._with_calls(text, final, self._calls, open_call)
