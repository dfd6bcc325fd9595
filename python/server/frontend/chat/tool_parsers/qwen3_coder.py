"""Qwen3-Coder's XML tool calls (`qwen3_coder`, and `qwen3_xml` for it, as vLLM registers
them), one block per call:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

Each value loses one newline at each end (the template's) and is typed by the tool's
schema for that parameter (`schema_values`: `3` becomes a number for an integer parameter,
a string for a string one); a parameter the schema does not name, or a tool the request
does not declare, keeps its text as a string. The arguments are the JSON object of the
parameters in the order written.

Streamed, each parameter goes out once its value is complete, except a string value,
which goes out as it grows (less a newline at its end and what may be the start of its
closing tag, both held back). A value also ends at the next `<parameter=` or at
`</function>` when its closing tag is missing, as vLLM reads it. Unlike vLLM, a
`<function=` block without `<tool_call>` before it is not a call.
"""

from __future__ import annotations

import json

from server.frontend.chat.tool_parsers import _json_scan as js
from server.frontend.chat.tool_parsers._framed import (
    Body,
    BodyState,
    Frame,
    FramedScanner,
    FramedToolParser,
)
from server.frontend.chat.tool_parsers.base import CallProgress, Scanner, partial_overlap
from server.frontend.chat.tool_parsers.schema_values import parameter_types, typed_value

TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
_VALUE_ENDS = (PARAMETER_END, PARAMETER, FUNCTION_END)
_STRING = frozenset({"string"})


def _name(header: str) -> str | None:
    header = header.strip()
    if not header.startswith(FUNCTION):
        return None
    name = header[len(FUNCTION) :].strip()
    return name if name and "<" not in name and "\n" not in name else None


FRAME = Frame(opener=TOOL_CALL, call_begin=TOOL_CALL, header_end=">",
              closers=(TOOL_CALL_END,), name_of=_name)


def _trimmed(value: str) -> str:
    value = value.removeprefix("\n")
    return value.removesuffix("\n")


def _item(key: str, value: object) -> str:
    return json.dumps(key, ensure_ascii=False) + ": " + json.dumps(value, ensure_ascii=False)


class _Parameters(Body):
    """The `<parameter=…>` tags up to `</function>`, read on from the last complete one."""

    def __init__(self, start: int, types: dict[str, frozenset[str]]) -> None:
        self._pos = start
        self._types = types
        self._closed = "{"  # the arguments text of the complete parameters
        self._count = 0
        self._key: str | None = None  # the open parameter
        self._value_at = 0  # where its value starts
        self._escaped = ""  # the escaped part of an open string value sent so far
        self._escaped_to = 0

    def advance(self, text: str, final: bool) -> BodyState:
        while True:
            if self._key is not None:
                state = self._read_value(text, final)
                if state is not None:
                    return state
                continue
            at = js.skip_ws(text, self._pos)
            self._pos = at
            if text.startswith(FUNCTION_END, at):
                arguments = self._closed + "}"
                return BodyState(CallProgress(None, arguments, complete=True),
                                 at + len(FUNCTION_END))
            if text.startswith(PARAMETER, at):
                close = text.find(">", at + len(PARAMETER))
                if close < 0:
                    return self._waiting(final)
                key = text[at + len(PARAMETER) : close].strip()
                if not key or "<" in key:
                    return BodyState(None, None, bad=True)
                self._key, self._value_at = key, close + 1
                self._escaped, self._escaped_to = "", close + 1
                continue
            rest = text[at:]
            if not rest or (not final and (FUNCTION_END.startswith(rest)
                                           or PARAMETER.startswith(rest))):
                return self._waiting(final)
            return BodyState(None, None, bad=True)

    def _waiting(self, final: bool) -> BodyState:
        return BodyState(None if final else CallProgress(None, self._closed), None, bad=final)

    def _read_value(self, text: str, final: bool) -> BodyState | None:
        """The open value: None once it closed (the loop reads on), else the progress."""
        assert self._key is not None
        found = [(i, end) for end in _VALUE_ENDS
                 if (i := text.find(end, self._value_at)) >= 0]
        if not found:
            if final:
                return BodyState(None, None, bad=True)
            return BodyState(CallProgress(None, self._open_string(text)), None)
        at, end = min(found)
        value = _trimmed(text[self._value_at : at])
        types = self._types.get(self._key, _STRING)
        item = _item(self._key, typed_value(value, types))
        self._closed += (", " if self._count else "") + item
        self._count += 1
        self._key = None
        self._pos = at + len(PARAMETER_END) if end == PARAMETER_END else at
        return None

    def _open_string(self, text: str) -> str:
        """The arguments so far with the open value's certain part, when it is a string."""
        key = self._key
        assert key is not None
        if self._types.get(key, _STRING) != _STRING:
            return self._closed
        held = max(partial_overlap(text, end) for end in _VALUE_ENDS)
        stop = len(text) - held
        if stop > self._value_at and text[stop - 1] == "\n":
            stop -= 1  # the newline the template puts before the closing tag
        start = self._value_at + (text.startswith("\n", self._value_at))
        if stop <= start:
            shown = ""
        else:
            self._escaped_to = max(self._escaped_to, start)
            if stop > self._escaped_to:
                self._escaped += json.dumps(text[self._escaped_to : stop],
                                            ensure_ascii=False)[1:-1]
                self._escaped_to = stop
            shown = self._escaped
        if not shown and stop <= self._value_at:
            return self._closed
        separator = ", " if self._count else ""
        return self._closed + separator + json.dumps(key, ensure_ascii=False) + ': "' + shown


class Qwen3CoderToolParser(FramedToolParser):
    name = "qwen3_coder"

    def new_scanner(self) -> Scanner:
        tools = self.tools
        return FramedScanner(self.name, FRAME,
                             lambda start, name: _Parameters(start, parameter_types(tools, name)))
