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

from server.api.openai.tool_parsers import _json_scan as js
from server.api.openai.tool_parsers._json_calls import CallShape, decode_call, scan_call
from server.api.openai.tool_parsers.base import (
    ParsedToolCalls,
    Scan,
    ToolParser,
    content_or_none,
    partial_overlap,
)

START = "<tool_call>"
END = "</tool_call>"
_SHAPE = CallShape(argument_keys=("arguments",))


class HermesToolParser(ToolParser):
    name = "hermes"
    keeps_special_tokens = True

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

    def _scan(self, text: str, final: bool) -> Scan:
        first = text.find(START)
        if first < 0:
            held = 0 if final else partial_overlap(text, START)
            return Scan(content=text[: len(text) - held])
        content = text[:first]
        scan = Scan(content=content)
        start = first
        while start >= 0:
            index = js.skip_ws(text, start + len(START))
            if index >= len(text):
                if final:
                    return Scan(content=text, invalid=True)
                break
            if text[index] != "{":
                return Scan(content=text, invalid=True)
            call = scan_call(text, index, _SHAPE, final)
            if call.bad:
                return Scan(content=text, invalid=True)
            if call.progress is not None:
                scan.calls.append(call.progress)
            if call.end is None:
                break
            after = js.skip_ws(text, call.end)
            rest = text[after:]
            if rest.startswith(END):
                after += len(END)
            elif rest and not (END.startswith(rest) and not final):
                return Scan(content=text, invalid=True)
            start = text.find(START, after)
        if final:
            scan.content = content_or_none(content, True) or ""
        return scan
