"""A scanner for JSON that is still arriving, shared by the JSON tool-call formats (hermes,
llama3_json, mistral, the required-tool-choice array).

`JsonValue` reads one value from where it starts in a growing text. Each `advance` reads
only the text that arrived since the one before: the scanner keeps where it stopped, the
open containers (a stack, not recursion) and whether it stopped inside a string, a key or
a number. So streaming a choice reads each character a bounded number of times, however
long the call grows (re-reading the whole text on every token made a call of k array
items cost O(k) per token).

It tells where the value ends, whether the text read so far can still become valid JSON,
and where the top-level members (or elements) of a container start and end. Validity is
the strict decoder's: a closed string, key, number or literal is what `loads_strict`
accepts (NaN and Infinity refused), and an open one is a prefix of such a token. A key is
checked once it closes; until then only its closing quote is looked for.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# A closed key's body: anything but quotes, escapes taken whole (any escaped character).
_KEY_BODY = re.compile(r'(?:[^"\\]+|\\.)*', re.DOTALL)
# A string value's body: plain characters and whole, valid escapes; no control characters.
_STRING_BODY = re.compile(r'(?:[^"\\\x00-\x1f]+|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*')
# An escape that has only begun, at the end of the text.
_PARTIAL_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{0,3})?")
_SCALAR_STOP = re.compile(r"[,}\] \t\n\r]")
_WHITESPACE = re.compile(r"\s*")
_JSON_WHITESPACE = re.compile(r"[ \t\n\r]*")
_OPEN_NUMBER = re.compile(r"-|-?(?:0|[1-9]\d*)(?:\.\d*)?|-?(?:0|[1-9]\d*)(?:\.\d+)?[eE][+-]?\d*")
_LITERALS = ("true", "false", "null")


def _reject_constant(name: str) -> Any:
    # NaN and Infinity are not JSON: arguments holding them would reach clients as
    # text no strict decoder accepts.
    raise ValueError(f"{name} is not a JSON value")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def loads_strict(text: str) -> Any:
    """Decode one JSON document, refusing NaN and Infinity."""
    return _DECODER.decode(text)


def raw_decode_strict(text: str, index: int) -> tuple[Any, int]:
    """Decode the JSON value at `index` (no leading whitespace) and return it with the
    index just past it."""
    return _DECODER.raw_decode(text, index)


def skip_ws(text: str, index: int) -> int:
    """Past any whitespace at `index` (the text around the JSON: tags, separators)."""
    match = _WHITESPACE.match(text, index)
    return match.end() if match else index


def _open_scalar_ok(tail: str) -> bool:
    """Whether a number or literal running to the end of the text can still become one."""
    return _OPEN_NUMBER.fullmatch(tail) is not None or any(w.startswith(tail) for w in _LITERALS)


@dataclass
class Member:
    """A top-level member of an object (`key`) or element of an array (`key` None)."""

    key: str | None
    start: int
    end: int | None  # just past the value, None while it is open


# What the scanner expects next.
_VALUE, _VALUE_OR_CLOSE, _KEY, _KEY_OR_CLOSE, _COLON, _AFTER = range(6)
_IN_STRING, _IN_KEY, _IN_SCALAR, _DONE = range(6, 10)


class JsonValue:
    """The JSON value that starts at `start` of a growing text, read as far as it goes.

    After `advance(text)`: `end` is the index just past the value (None while it may
    grow), `bad` whether the text can no longer be valid JSON there, and `members` the
    top-level members of an object or elements of an array (when made with
    `members=True`), each recorded once its value starts. What lies after the value is
    not read. Every `advance` must get the same text, grown or not.
    """

    __slots__ = (
        "_key",
        "_mode",
        "_pos",
        "_record",
        "_stack",
        "_token",
        "bad",
        "end",
        "members",
        "start",
    )

    def __init__(self, start: int, members: bool = False) -> None:
        self.start = start
        self.end: int | None = None
        self.bad = False
        self.members: list[Member] = []
        self._record = members
        self._pos = start  # where reading resumes
        self._mode = _VALUE
        self._stack: list[str] = []  # the open containers' brackets
        self._token = start  # where the open string, key or scalar starts
        self._key: str | None = None  # a top-level key waiting for its value

    def advance(self, text: str) -> None:
        if self.end is not None or self.bad:
            return
        pos, mode, stack = self._pos, self._mode, self._stack
        size = len(text)
        while True:
            if mode == _IN_STRING:
                pos = _STRING_BODY.match(text, pos).end()
                if pos >= size:
                    break
                if text[pos] == '"':
                    pos += 1
                    mode = self._closed(pos)
                    if mode == _DONE:
                        break
                    continue
                if text[pos] == "\\" and _PARTIAL_ESCAPE.fullmatch(text, pos):
                    break  # resumes at the escape once it is whole
                self.bad = True
                return
            if mode == _IN_KEY:
                pos = _KEY_BODY.match(text, pos).end()
                if pos >= size or text[pos] != '"':
                    break  # open, or a backslash that ends the text
                pos += 1
                try:
                    key = loads_strict(text[self._token : pos])
                except ValueError:
                    self.bad = True
                    return
                if len(stack) == 1:
                    self._key = key
                mode = _COLON
                continue
            if mode == _IN_SCALAR:
                stop = _SCALAR_STOP.search(text, pos)
                if stop is None:
                    pos = size
                    break
                pos = stop.start()
                try:
                    loads_strict(text[self._token : pos])
                except ValueError:
                    self.bad = True
                    return
                mode = self._closed(pos)
                if mode == _DONE:
                    break
                continue
            pos = _JSON_WHITESPACE.match(text, pos).end()
            if pos >= size:
                break
            char = text[pos]
            if mode == _AFTER:
                if char == ",":
                    pos += 1
                    mode = _KEY if stack[-1] == "{" else _VALUE
                    continue
                if char != ("}" if stack[-1] == "{" else "]"):
                    self.bad = True
                    return
            elif mode == _COLON:
                if char != ":":
                    self.bad = True
                    return
                pos += 1
                mode = _VALUE
                continue
            elif mode == _KEY or mode == _KEY_OR_CLOSE:
                if char != "}" or mode == _KEY:
                    if char != '"':
                        self.bad = True
                        return
                    self._token = pos
                    pos += 1
                    mode = _IN_KEY
                    continue
            elif char != "]" or mode == _VALUE:
                # A value starts here.
                if char in ",:}]":
                    self.bad = True
                    return
                if self._record and len(stack) == 1:
                    self.members.append(Member(self._key if stack[0] == "{" else None, pos, None))
                if char == '"':
                    self._token = pos
                    pos += 1
                    mode = _IN_STRING
                elif char == "{" or char == "[":
                    stack.append(char)
                    pos += 1
                    mode = _KEY_OR_CLOSE if char == "{" else _VALUE_OR_CLOSE
                else:
                    self._token = pos
                    mode = _IN_SCALAR
                continue
            # A closing bracket where one may stand.
            stack.pop()
            pos += 1
            mode = self._closed(pos)
            if mode == _DONE:
                break
        if mode == _IN_SCALAR and not _open_scalar_ok(text[self._token :]):
            self.bad = True
            return
        self._pos, self._mode = pos, mode

    def _closed(self, end: int) -> int:
        """A value has ended at `end`: the whole value, or a member of the open container."""
        if not self._stack:
            self.end = end
            return _DONE
        if self._record and len(self._stack) == 1:
            self.members[-1].end = end
        return _AFTER
