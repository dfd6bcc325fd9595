"""The pythonic format (Llama 3.2 / 4 and ToolACE-style models): the reply is a Python
list of calls, `[get_weather(city="Paris"), add(a=1, b=2)]`.

The list is read with `ast`, never evaluated: a call is a (dotted) name with keyword
arguments whose values are literals only: strings, numbers, booleans, None (or the JSON
spellings true/false/null), and lists, tuples, sets and dicts of those. Anything else (a
positional argument, a nested call, a name, an f-string with a placeholder) means the
reply is not tool calls and is returned whole as content, as is a reply that does not
open with `[`. When calls are found there is no content; text after the closing `]` is
dropped (vLLM's `pythonic` parser keeps positional arguments out silently and requires
the list to be the whole reply; here the first is refused and the second relaxed, so
that streamed and finished replies agree).

Arguments are JSON objects in the order written, rendered as `json.dumps` renders a dict.
Streaming sends each keyword argument once its value is complete.
"""

from __future__ import annotations

import ast
import functools
import json
import keyword
import math
import re
from typing import Any

from server.frontend.chat.tool_parsers import _json_scan as js
from server.frontend.chat.tool_parsers.base import (
    CallProgress,
    ParsedToolCalls,
    Scan,
    Scanner,
    ToolParser,
)

_DOTTED = re.compile(r"[^\W\d]\w*(?:\.[^\W\d]\w*)*")
_KEY = re.compile(r"[^\W\d]\w*")
_VALUE_STOP = re.compile(r"[\"'()\[\]{},]")
_JSON_NAMES = {"true": True, "false": False, "null": None}


class _NotToolCalls(Exception):
    pass


def _value(node: ast.AST) -> Any:
    """The JSON value of a literal node."""
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float) and math.isfinite(value):
            return value
        raise _NotToolCalls("not a JSON literal")
    if isinstance(node, ast.Dict):
        out = {}
        for key, item in zip(node.keys, node.values):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                raise _NotToolCalls("dict keys must be strings")
            out[key.value] = _value(item)
        return out
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_value(item) for item in node.elts]
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _value(node.operand)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.JoinedStr) and all(
        isinstance(part, ast.Constant) for part in node.values
    ):
        return "".join(str(part.value) for part in node.values)  # type: ignore[attr-defined]
    raise _NotToolCalls(f"not a literal: {type(node).__name__}")


@functools.lru_cache(maxsize=1024)
def _literal_json(source: str) -> str:
    """An argument value's source as JSON text (cached: streaming re-reads each value
    once per token)."""
    try:
        node = ast.parse(source.strip(), mode="eval").body
    except (SyntaxError, ValueError) as exc:
        raise _NotToolCalls(str(exc)) from exc
    return json.dumps(_value(node), ensure_ascii=False)


def _call_name(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise _NotToolCalls("call target is not a name")
    parts.append(node.id)
    return ".".join(reversed(parts))


def _call(node: ast.AST) -> tuple[str, str]:
    if not isinstance(node, ast.Call) or node.args:
        raise _NotToolCalls("not a call with keyword arguments only")
    arguments = {}
    for argument in node.keywords:
        if argument.arg is None or argument.arg in arguments:
            # `ast` leaves a repeated keyword to the compiler to refuse.
            raise _NotToolCalls("** or a repeated keyword in a call")
        arguments[argument.arg] = _value(argument.value)
    return _call_name(node.func), json.dumps(arguments, ensure_ascii=False)


_BAD = -1


class _ValueEnd:
    """Where the argument value starting at `start` of a growing text ends: the index of
    the `,` or `)` after it, None while the text may still extend it, _BAD when a bracket
    closes that was never opened. Each `advance` reads on from where the last stopped:
    past the last bracket, or inside a string literal."""

    __slots__ = ("_delimiter", "_depth", "_escaped_to", "_pos", "_quote", "_searched", "start")

    def __init__(self, start: int) -> None:
        self.start = start
        self._pos = start  # where the search for brackets, commas and quotes resumes
        self._depth = 0
        self._quote = -1  # the open string literal's opening quote
        self._delimiter = ""  # its closing quote(s), "" while a triple quote may still open
        self._escaped_to = 0  # the string's text before this holds no closing quote
        self._searched = 0  # the text searched for a delimiter or backslash before this

    def advance(self, text: str) -> int | None:
        pos, depth = self._pos, self._depth
        while True:
            if self._quote >= 0:
                end = self._string_end(text)
                if end is None:
                    return None
                self._quote, pos = -1, end
            match = _VALUE_STOP.search(text, pos)
            if match is None:
                self._pos, self._depth = len(text), depth
                return None
            char = match.group()
            if char in "\"'":
                self._quote, self._delimiter = match.start(), ""
                self._pos, self._depth = match.start(), depth
                continue
            if depth == 0 and char in ",)":
                return match.start()
            if char in "([{":
                depth += 1
            elif char in ")]}":
                if depth == 0:
                    return _BAD
                depth -= 1
            pos = match.end()

    def _string_end(self, text: str) -> int | None:
        """Index just past the string literal whose quote is at `_quote`, None while open."""
        index, size = self._quote, len(text)
        if not self._delimiter:
            quote = text[index]
            if text.startswith(quote * 3, index):
                self._delimiter, self._escaped_to = quote * 3, index + 3
            elif size - index < 3 and text[index:] == quote * (size - index):
                return None  # '' or ' at the end: an empty string or a triple quote opening
            else:
                self._delimiter, self._escaped_to = quote, index + 1
            self._searched = self._escaped_to
        delimiter, pos = self._delimiter, self._escaped_to
        while True:
            # Neither a delimiter nor a backslash starts in [pos, _searched) but perhaps
            # a delimiter that the text cut short.
            closing = text.find(delimiter, max(pos, self._searched - len(delimiter) + 1))
            backslash = text.find("\\", max(pos, self._searched))
            stop = min((i for i in (closing, backslash) if i >= 0), default=-1)
            if stop < 0:
                self._escaped_to, self._searched = pos, size
                return None
            if text[stop] == "\\":
                pos = stop + 2
                continue
            return stop + len(delimiter)


# Where the reading of the list stands: before a call, in its arguments, before a value
# (after `=`), in a value, after a call's `)`.
_CALL, _ARGUMENTS, _BEFORE_VALUE, _IN_VALUE, _AFTER_CALL = range(5)


class PythonicToolParser(ToolParser):
    name = "pythonic"

    def _parse(self, text: str) -> ParsedToolCalls:
        start = js.skip_ws(text, 0)
        if not text.startswith("[", start):
            return ParsedToolCalls(content=text)
        close = text.find("]", start)
        while close >= 0:
            # The list ends at the first `]` after which the text parses.
            try:
                node = ast.parse(text[start : close + 1], mode="eval").body
            except (SyntaxError, ValueError):
                close = text.find("]", close + 1)
                continue
            if not isinstance(node, ast.List) or not node.elts:
                return ParsedToolCalls(content=text)
            try:
                pairs = [_call(element) for element in node.elts]
            except _NotToolCalls:
                return ParsedToolCalls(content=text)
            return ParsedToolCalls(content=None, calls=self._calls(pairs))
        return ParsedToolCalls(content=text)

    def new_scanner(self) -> Scanner:
        return _PythonicScanner(self.name)


class _PythonicScanner(Scanner):
    """The list is read on from the last point the text ran out at: before a call, a
    keyword or a value, or inside a value (`_ValueEnd`). Each finished argument is
    converted once and appended to its call's arguments."""

    def __init__(self, parser_name: str) -> None:
        super().__init__(parser_name)
        self._start: int | None = None  # the `[`, -1 for prose
        self._pos = 0
        self._stage = _CALL
        self._calls: list[CallProgress] = []
        self._call = CallProgress(None)
        self._keys: set[str] = set()
        self._key = ""
        self._value: _ValueEnd | None = None
        self._done = False  # the list's `]` was read
        self._invalid = False

    def _advance(self, text: str, final: bool) -> Scan:
        size = len(text)
        if self._start is None:
            start = self._pos = js.skip_ws(text, self._pos)
            if start >= size:
                return Scan(content_end=size if final else 0)
            self._start = start if text[start] == "[" else -1
            self._pos = start + 1
        if self._start < 0:
            return Scan(content_end=size)
        if not self._done and not self._invalid:
            try:
                self._done = self._read(text)
            except _NotToolCalls:
                self._invalid = True
        if self._invalid or (final and not self._done):
            return Scan(content_end=size, invalid=True)
        return Scan(calls=self._calls)

    def _read(self, text: str) -> bool:
        """Read the list body on; True once its `]` is reached, False while the text may
        continue it."""
        size = len(text)
        pos = self._pos
        while True:
            if self._stage == _CALL:
                pos = js.skip_ws(text, pos)
                if pos >= size:
                    break
                if self._calls and text[pos] == "]":
                    return True
                name = _DOTTED.match(text, pos)
                if name is None:
                    raise _NotToolCalls("expected a call")
                after = js.skip_ws(text, name.end())
                if after >= size or (text[after] == "." and after + 1 >= size):
                    break  # the name may still grow
                if text[after] != "(" or any(
                    keyword.iskeyword(p) for p in name.group().split(".")
                ):
                    raise _NotToolCalls("expected (")
                # Announced once its first keyword or its `)` shows it is a call the
                # format allows: `f("Paris")`, a positional call, stays content.
                self._call, self._keys = CallProgress(name.group(), "{"), set()
                self._stage, pos = _ARGUMENTS, after + 1
            if self._stage == _ARGUMENTS:
                pos = js.skip_ws(text, pos)
                if pos >= size:
                    break
                call = self._call
                if text[pos] == ")":
                    if not self._keys:
                        self._calls.append(call)
                    call.arguments += "}"
                    call.complete = True
                    self._stage, pos = _AFTER_CALL, pos + 1
                    continue
                key = _KEY.match(text, pos)
                if key is None:
                    raise _NotToolCalls("expected a keyword argument")
                after = js.skip_ws(text, key.end())
                if after >= size:
                    break
                if key.group() in self._keys or keyword.iskeyword(key.group()):
                    raise _NotToolCalls("repeated or reserved keyword")
                if text[after] != "=" or text.startswith("==", after):
                    raise _NotToolCalls("expected =")
                if not self._keys:
                    self._calls.append(call)
                self._key, self._stage, pos = key.group(), _BEFORE_VALUE, after + 1
            if self._stage == _BEFORE_VALUE:
                pos = js.skip_ws(text, pos)
                if pos >= size:
                    break
                self._value, self._stage = _ValueEnd(pos), _IN_VALUE
            if self._stage == _IN_VALUE:
                value = self._value
                assert value is not None
                end = value.advance(text)
                if end is None:
                    break
                if end == _BAD:
                    raise _NotToolCalls("unbalanced brackets")
                call, key = self._call, self._key
                item = f"{json.dumps(key, ensure_ascii=False)}: "
                item += _literal_json(text[value.start : end])
                call.arguments += item if not self._keys else ", " + item
                self._keys.add(key)
                self._value, self._stage = None, _ARGUMENTS
                pos = end + 1 if text[end] == "," else end
                continue
            if self._stage == _AFTER_CALL:
                pos = js.skip_ws(text, pos)
                if pos >= size:
                    break
                if text[pos] == "]":
                    return True
                if text[pos] != ",":
                    raise _NotToolCalls("expected , or ]")
                self._stage, pos = _CALL, pos + 1
        self._pos = pos
        return False
