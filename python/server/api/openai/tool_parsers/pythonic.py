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

from server.api.openai.tool_parsers import _json_scan as js
from server.api.openai.tool_parsers.base import CallProgress, ParsedToolCalls, Scan, ToolParser

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


def _string_end(text: str, index: int) -> int | None:
    """Index just past the Python string literal whose quote is at `index`."""
    quote = text[index]
    if text.startswith(quote * 3, index):
        delimiter, pos = quote * 3, index + 3
    elif len(text) - index < 3 and text[index:] == quote * (len(text) - index):
        return None  # '' or ' at the end: an empty string or a triple quote opening
    else:
        delimiter, pos = quote, index + 1
    while True:
        stop = min(
            (i for i in (text.find(delimiter, pos), text.find("\\", pos)) if i >= 0),
            default=-1,
        )
        if stop < 0:
            return None
        if text[stop] == "\\":
            pos = stop + 2
            continue
        return stop + len(delimiter)


_BAD = -1


def _value_end(text: str, index: int) -> int | None:
    """Index of the `,` or `)` ending the argument value at `index`; None while the text
    may still extend it, _BAD when a bracket closes that was never opened."""
    depth = 0
    pos = index
    while True:
        match = _VALUE_STOP.search(text, pos)
        if match is None:
            return None
        char = match.group()
        if char in "\"'":
            end = _string_end(text, match.start())
            if end is None:
                return None
            pos = end
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

    def _scan(self, text: str, final: bool) -> Scan:
        start = js.skip_ws(text, 0)
        if start >= len(text):
            return Scan(content=text if final else "")
        if text[start] != "[":
            return Scan(content=text)
        calls: list[CallProgress] = []
        try:
            done = self._scan_list(text, start + 1, final, calls)
        except _NotToolCalls:
            return Scan(content=text, invalid=True)
        if final and not done:
            return Scan(content=text, invalid=True)
        return Scan(calls=calls)

    @staticmethod
    def _scan_list(text: str, pos: int, final: bool, calls: list[CallProgress]) -> bool:
        """Append the calls of the list body at `pos`; True once its `]` is reached,
        False while the text may continue it."""
        size = len(text)
        while True:
            pos = js.skip_ws(text, pos)
            if pos >= size:
                return False
            if calls and text[pos] == "]":
                return True
            name = _DOTTED.match(text, pos)
            if name is None:
                raise _NotToolCalls("expected a call")
            pos = js.skip_ws(text, name.end())
            if pos >= size or (text[pos] == "." and pos + 1 >= size):
                return False  # the name may still grow
            if text[pos] != "(" or any(keyword.iskeyword(p) for p in name.group().split(".")):
                raise _NotToolCalls("expected (")
            # Announced once its first keyword or its `)` shows it is a call the
            # format allows: `f("Paris")`, a positional call, stays content.
            call = CallProgress(name.group(), "{")
            items: list[str] = []
            keys: set[str] = set()
            pos += 1
            while True:
                pos = js.skip_ws(text, pos)
                if pos >= size:
                    return False
                if text[pos] == ")":
                    if not items:
                        calls.append(call)
                    call.arguments = "{" + ", ".join(items) + "}"
                    call.complete = True
                    pos += 1
                    break
                key = _KEY.match(text, pos)
                if key is None:
                    raise _NotToolCalls("expected a keyword argument")
                pos = js.skip_ws(text, key.end())
                if pos >= size:
                    return False
                if key.group() in keys or keyword.iskeyword(key.group()):
                    raise _NotToolCalls("repeated or reserved keyword")
                if text[pos] != "=" or text.startswith("==", pos):
                    raise _NotToolCalls("expected =")
                if not keys:
                    calls.append(call)
                pos = js.skip_ws(text, pos + 1)
                if pos >= size:
                    return False
                end = _value_end(text, pos)
                if end is None:
                    return False
                if end == _BAD:
                    raise _NotToolCalls("unbalanced brackets")
                keys.add(key.group())
                items.append(
                    f"{json.dumps(key.group(), ensure_ascii=False)}: {_literal_json(text[pos:end])}"
                )
                call.arguments = "{" + ", ".join(items)
                pos = end + 1 if text[end] == "," else end
            pos = js.skip_ws(text, pos)
            if pos >= size:
                return False
            if text[pos] == "]":
                return True
            if text[pos] != ",":
                raise _NotToolCalls("expected , or ]")
            pos += 1
