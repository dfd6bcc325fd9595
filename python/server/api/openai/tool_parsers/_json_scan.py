"""A structural scanner for JSON that may still be arriving, shared by the JSON tool-call
formats (hermes, llama3_json, mistral, the required-tool-choice array).

Streaming re-reads the whole text each time a token arrives, so every answer here is
prefix-stable: scanning a longer text yields the same spans, only extended. The scanner
finds where values start and end (strings, escapes and nesting respected) and checks the
punctuation between members; `is_valid_prefix` says whether a value that has not ended
can still become valid JSON. It hands every complete part to the strict decoder (C code)
and checks only the open tail with regular expressions: `partial-json-parser`, pure
Python over the whole text on every token, cost ~0.7 s of CPU to stream one 4 KB call.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

_STRUCTURAL = re.compile(r'["{}\[\]]')
# A string up to its closing quote, escapes skipped. The body is taken in a lookahead,
# which the engine never re-enters, so a string that has not closed fails in one pass
# instead of backtracking through every split of its body.
_CLOSED_STRING = re.compile(r'"(?=((?:[^"\\]+|\\.)*))\1"', re.DOTALL)
_SCALAR_STOP = re.compile(r"[,}\] \t\n\r]")
_WHITESPACE = re.compile(r"\s*")
_JSON_WHITESPACE = re.compile(r"[ \t\n\r]*")
# The body of a string that has not closed: plain characters and whole escapes (taken
# atomically, as above), then perhaps an escape that has only begun.
_OPEN_STRING = re.compile(
    r'(?=((?:[^"\\\x00-\x1f]+|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*))\1'
    r"(?:\\(?:u[0-9a-fA-F]{0,3})?)?"
)
_OPEN_NUMBER = re.compile(r"-|-?(?:0|[1-9]\d*)(?:\.\d*)?|-?(?:0|[1-9]\d*)(?:\.\d+)?[eE][+-]?\d*")


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


def _skip_json_ws(text: str, index: int) -> int:
    match = _JSON_WHITESPACE.match(text, index)
    return match.end() if match else index


# One streamed text is scanned from several places (the call, its validity, each
# nesting level), each asking where the same values end. The caches answer repeats
# within one scan; the key's text is the same object each time, so its hash is cached
# and equality is identity. `clear_caches` runs after every scan, so no text outlives
# its scan here.
_scan_cache = functools.lru_cache(maxsize=512)


@_scan_cache
def string_end(text: str, index: int) -> int | None:
    """Index just past the string whose opening quote is at `index`, None if it has not
    closed yet."""
    match = _CLOSED_STRING.match(text, index)
    return match.end() if match else None


@_scan_cache
def value_end(text: str, index: int) -> int | None:
    """Index just past the JSON value starting at `index`, None if it may still grow."""
    first = text[index]
    if first == '"':
        return string_end(text, index)
    if first in "{[":
        depth = 0
        pos = index
        while True:
            match = _STRUCTURAL.search(text, pos)
            if match is None:
                return None
            char = match.group()
            if char == '"':
                end = string_end(text, match.start())
                if end is None:
                    return None
                pos = end
                continue
            pos = match.end()
            depth += 1 if char in "{[" else -1
            if depth == 0:
                return pos
    # A number or literal ends at the first delimiter; at the end of the text it may
    # still be growing.
    match = _SCALAR_STOP.search(text, index)
    return match.start() if match else None


def _complete_is_valid(text: str, start: int, end: int) -> bool:
    try:
        loads_strict(text[start:end])
    except ValueError:
        return False
    return True


def is_valid_prefix(text: str, index: int = 0) -> bool:
    """Whether the value starting at `index` and running to the end of `text` is valid
    JSON or can still grow into it."""
    end = value_end(text, index)
    if end is not None:
        return _complete_is_valid(text, index, end) and not text[end:].strip()
    first = text[index]
    if first == '"':
        return _OPEN_STRING.fullmatch(text, index + 1) is not None
    if first in "{[":
        if first == "{":
            obj = scan_object(text, index)
            bad, spans = obj.bad, [(m.start, m.end) for m in obj.members]
        else:
            array = scan_array(text, index)
            bad, spans = array.bad, array.elements
        if bad:
            return False
        for start, stop in spans:
            if stop is None:
                return is_valid_prefix(text, start)
            if not _complete_is_valid(text, start, stop):
                return False
        return True
    tail = text[index:]
    if _OPEN_NUMBER.fullmatch(tail):
        return True
    return any(word.startswith(tail) for word in ("true", "false", "null"))


@dataclass
class Member:
    key: str
    start: int
    end: int | None


@dataclass
class ObjectScan:
    members: list[Member]
    end: int | None  # just past the closing brace, None while open
    bad: bool  # the text cannot be an object any more


def scan_object(text: str, index: int) -> ObjectScan:
    """The top-level members of the object whose `{` is at `index`."""
    members: list[Member] = []
    pos = index + 1
    size = len(text)
    after_value = False
    while True:
        pos = _skip_json_ws(text, pos)
        if pos >= size:
            return ObjectScan(members, None, False)
        char = text[pos]
        if char == "}" and (after_value or not members):
            return ObjectScan(members, pos + 1, False)
        if after_value:
            if char != ",":
                return ObjectScan(members, None, True)
            after_value = False
            pos += 1
            continue
        if char != '"':
            return ObjectScan(members, None, True)
        key_end = string_end(text, pos)
        if key_end is None:
            return ObjectScan(members, None, False)
        try:
            key = loads_strict(text[pos:key_end])
        except ValueError:
            return ObjectScan(members, None, True)
        pos = _skip_json_ws(text, key_end)
        if pos >= size:
            return ObjectScan(members, None, False)
        if text[pos] != ":":
            return ObjectScan(members, None, True)
        pos = _skip_json_ws(text, pos + 1)
        if pos >= size:
            return ObjectScan(members, None, False)
        if text[pos] in ",:}]":
            return ObjectScan(members, None, True)
        end = value_end(text, pos)
        members.append(Member(key, pos, end))
        if end is None:
            return ObjectScan(members, None, False)
        pos, after_value = end, True


@dataclass
class ArrayScan:
    elements: list[tuple[int, int | None]]  # (start, end) of each element
    end: int | None
    bad: bool


def scan_array(text: str, index: int) -> ArrayScan:
    """The elements of the array whose `[` is at `index`."""
    elements: list[tuple[int, int | None]] = []
    pos = index + 1
    size = len(text)
    after_value = False
    while True:
        pos = _skip_json_ws(text, pos)
        if pos >= size:
            return ArrayScan(elements, None, False)
        char = text[pos]
        if char == "]" and (after_value or not elements):
            return ArrayScan(elements, pos + 1, False)
        if after_value:
            if char != ",":
                return ArrayScan(elements, None, True)
            after_value = False
            pos += 1
            continue
        if char in ",:}]":
            return ArrayScan(elements, None, True)
        end = value_end(text, pos)
        elements.append((pos, end))
        if end is None:
            return ArrayScan(elements, None, False)
        pos, after_value = end, True


def clear_caches() -> None:
    string_end.cache_clear()
    value_end.cache_clear()
