"""gpt-oss's Harmony tool calls (`openai`, as vLLM registers it, and `gpt_oss`): a message
addressed to a function is a call, its body the arguments:

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

Messages are read as `reasoning.harmony` reads them (a header, `<|message|>`, a body up to
`<|end|>`, `<|return|>`, `<|call|>`, or up to the next `<|start|>` / `<|channel|>`; the end
of the text closes the last one, since `<|call|>` and `<|return|>` stop generation). A
recipient `functions.NAME` (or any recipient but `assistant` and the built-in `python`,
`browser.*`, `container.*`) makes a call to NAME with the body, stripped, as arguments
(`{}` when empty), streamed as it arrives. `final` messages and `commentary` without a
recipient are the content, joined with "\\n"; everything else (analysis, built-in tools)
is dropped here: the reasoning parser reads the analysis. Text that does not begin like
Harmony is content as it is.
"""

from __future__ import annotations

import re

from server.frontend.chat.reasoning.harmony import CLOSES, MESSAGE, REOPENS, message_side
from server.frontend.chat.tool_parsers._framed import FramedToolParser
from server.frontend.chat.tool_parsers.base import CallProgress, Scan, Scanner, partial_overlap

_MARKERS = CLOSES + REOPENS
_LONGEST = max(map(len, _MARKERS + (MESSAGE,)))
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_BUILTIN = ("python", "browser", "container")
_HARMONY_START = "<|"


def function_name(header: str) -> str | None:
    """The function a message with this header calls, None when it calls none."""
    found = _RECIPIENT.search(header)
    if found is None:
        return None
    recipient = found.group(1)
    if recipient.startswith("functions."):
        return recipient[len("functions.") :] or None
    if recipient == "assistant" or recipient.split(".", 1)[0] in _BUILTIN:
        return None
    return recipient


class HarmonyToolParser(FramedToolParser):
    name = "openai"

    def new_scanner(self) -> Scanner:
        return _HarmonyScanner(self.name)


_HEADER, _BODY, _PLAIN = range(3)


class _HarmonyScanner(Scanner):
    def __init__(self, parser_name: str) -> None:
        super().__init__(parser_name)
        self._stage = _HEADER
        self._pos = 0  # the current header's or body's start
        self._search = 0  # where the search for the next marker goes on
        self._side = "drop"
        self._call: CallProgress | None = None  # the current message's call
        self._calls: list[CallProgress] = []
        self._content: list[str] = []  # the closed content messages

    def _advance(self, text: str, final: bool) -> Scan:
        if self._stage == _PLAIN:
            return Scan(content_end=len(text))
        if not self._calls and not self._content and self._pos == 0:
            lead = text.lstrip()
            if lead and not (lead.startswith(_HARMONY_START) or _HARMONY_START.startswith(lead)):
                self._stage = _PLAIN
                return Scan(content_end=len(text))
        open_content = ""
        open_call = None
        while True:
            if self._stage == _HEADER:
                at = text.find(MESSAGE, self._search)
                if at < 0:
                    self._search = max(self._search, len(text) - len(MESSAGE) + 1)
                    break
                header = text[self._pos : at]
                name = function_name(header)
                self._side = "call" if name is not None else message_side(header)
                self._call = CallProgress(name) if name is not None else None
                self._stage, self._pos = _BODY, at + len(MESSAGE)
                self._search = self._pos
            found = [(i, m) for m in _MARKERS if (i := text.find(m, self._search)) >= 0]
            if found:
                at, marker = min(found)
                self._close(text[self._pos : at], text, self._pos)
                self._stage = _HEADER
                self._pos = self._search = at + len(marker) if marker in CLOSES else at
                continue
            self._search = max(self._search, len(text) - _LONGEST + 1)
            if final:
                self._close(text[self._pos :], text, self._pos)
                self._stage, self._pos = _HEADER, len(text)
                break
            end = len(text) - max(partial_overlap(text, m) for m in _MARKERS)
            if self._side == "content":
                open_content = text[self._pos : max(end, self._pos)]
            elif self._call is not None:
                open_call = self._call
                start, stop = self._span(text, self._pos, end)
                open_call.span = (start, stop)
            break
        parts = self._content + ([open_content] if open_content else [])
        return Scan(content="\n".join(parts), calls=self._calls, open_call=open_call)

    @staticmethod
    def _span(text: str, start: int, stop: int) -> tuple[int, int]:
        """The body's stretch less the whitespace around it."""
        while start < stop and text[start].isspace():
            start += 1
        while stop > start and text[stop - 1].isspace():
            stop -= 1
        return start, stop

    def _close(self, body: str, text: str, start: int) -> None:
        if self._side == "content":
            if body:
                self._content.append(body)
        elif self._call is not None:
            call = self._call
            span = self._span(text, start, start + len(body))
            if span[1] > span[0]:
                call.span = span
            else:
                call.span, call.arguments = None, "{}"
            call.complete = True
            self._calls.append(call)
            self._call = None
