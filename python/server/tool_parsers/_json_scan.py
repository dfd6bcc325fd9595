"""A structural scanner for JSON that may still be arriving, shared by the JSON tool-call
formats (hermes, llama3_json, mistral, the required-tool-choice array).

Streaming re-reads the whole text each time a token arrives, so every answer here is
prefix-stable: scanning a longer text yields the same spans, only extended. The scanner
finds where values start and end (strings, escapes and nesting respected) and nothing
more; whether the text is valid JSON is asked of `partial-json-parser` while a value is
incomplete and of the strict decoder once it is complete.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import partial_json_parser

_STRUCTURAL = re.compile(r'["{}\[\]]')
_STRING_STOP = re.compile(r'["\\]')
_SCALAR_STOP = re.compile(r"[,}\]\s]")
_WHITESPACE = re.compile(r"\s*")


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
    match = _WHITESPACE.match(text, index)
    return match.end() if match else index


def is_valid_prefix(text: str) -> bool:
    """Whether `text` can still grow into valid JSON."""
    try:
        partial_json_parser.loads(text)
    except Exception:  # the library raises several types for malformed input
        return False
    return True


def string_end(text: str, index: int) -> int | None:
    """Index just past the string whose opening quote is at `index`, None if it has not
    closed yet."""
    pos = index + 1
    while True:
        match = _STRING_STOP.search(text, pos)
        if match is None:
            return None
        if match.group() == '"':
            return match.end()
        pos = match.end() + 1
        if pos > len(text):
            return None


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
    while True:
        pos = skip_ws(text, pos)
        if pos >= size:
            return ObjectScan(members, None, False)
        char = text[pos]
        if char == "}":
            return ObjectScan(members, pos + 1, False)
        if char == "," and members:
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
        pos = skip_ws(text, key_end)
        if pos >= size:
            return ObjectScan(members, None, False)
        if text[pos] != ":":
            return ObjectScan(members, None, True)
        pos = skip_ws(text, pos + 1)
        if pos >= size:
            return ObjectScan(members, None, False)
        end = value_end(text, pos)
        members.append(Member(key, pos, end))
        if end is None:
            return ObjectScan(members, None, False)
        pos = end


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
    while True:
        pos = skip_ws(text, pos)
        if pos >= size:
            return ArrayScan(elements, None, False)
        char = text[pos]
        if char == "]":
            return ArrayScan(elements, pos + 1, False)
        if char == "," and elements:
            pos += 1
            continue
        if char in ",}:":
            return ArrayScan(elements, None, True)
        end = value_end(text, pos)
        elements.append((pos, end))
        if end is None:
            return ArrayScan(elements, None, False)
        pos = end
