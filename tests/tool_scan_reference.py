"""The tool-call stream as it read text before its scans resumed: each delta re-scans the
whole text received so far (O(n) per delta, O(n^2) per choice). Frozen here, verbatim, as
the oracle the incremental scanners must agree with delta for delta
(tests/test_tool_stream_incremental.py), and as the same-run baseline of
scripts/bench_tool_stream.py. Only the reading of growing text is frozen: the constants,
`decode_call`, `content_or_none`, `partial_overlap` and the pythonic literal conversion
are the package's own (unchanged by the resumable scans). The JSON scanner's object and
array loops below repeat each other as they did in the package: kept as they were.
"""

from __future__ import annotations

import functools
import json
import keyword
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from server.frontend.chat.tool_parsers import hermes, llama3_json, mistral, pythonic
from server.frontend.chat.tool_parsers._json_calls import CallShape, arguments_text, decode_call
from server.frontend.chat.tool_parsers.base import (
    ContentDelta,
    Delta,
    ToolCallDelta,
    ToolParser,
    content_or_none,
    partial_overlap,
)
from server.frontend.chat.tool_parsers.tool_schema import (
    NamedToolCallParser, RequiredToolCallParser,
)

logger = logging.getLogger(__name__)

# -- _json_scan ------------------------------------------------------------------


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


# -- base -------------------------------------------------------------------------------


@dataclass
class CallProgress:
    name: str | None
    arguments: str = ""
    complete: bool = False


@dataclass
class Scan:
    content: str = ""
    calls: list[CallProgress] = field(default_factory=list)
    invalid: bool = False


# -- _json_calls -----------------------------------------------------------------


@dataclass
class ObjectCall:
    progress: CallProgress | None  # None until a complete name is known
    end: int | None  # just past the object, None while it is open
    bad: bool  # the text can no longer become a call


def scan_call(text: str, index: int, shape: CallShape, final: bool) -> ObjectCall:
    """The call whose `{` is at `index`, as far as the text makes it certain.

    An object arguments value streams as its raw text, which is a prefix of the final
    value at every step; any other value (a string, say) is sent whole once complete,
    in the same form `decode_call` gives it.
    """
    scan = scan_object(text, index)
    if scan.bad:
        return ObjectCall(None, None, True)
    if scan.end is not None:
        # Complete: the strict decoder settles it.
        try:
            decoded = decode_call(loads_strict(text[index : scan.end]), shape)
        except ValueError:
            decoded = None
        if decoded is None:
            return ObjectCall(None, scan.end, True)
        name, arguments = decoded
        raw = _argument_member(scan, shape)
        if raw is not None and text[raw.start] == "{":
            arguments = text[raw.start : raw.end]
        return ObjectCall(CallProgress(name, arguments, complete=True), scan.end, False)
    if final or not is_valid_prefix(text, index):
        return ObjectCall(None, None, True)
    name = None
    for member in scan.members:
        if member.key == "name" and member.end is not None:
            try:
                value = loads_strict(text[member.start : member.end])
            except ValueError:
                return ObjectCall(None, None, True)
            if not isinstance(value, str):
                return ObjectCall(None, None, True)
            name = value
    raw = _argument_member(scan, shape)
    if name is None or raw is None:
        return ObjectCall(None, None, False)
    if text[raw.start] == "{":
        arguments = text[raw.start : raw.end if raw.end is not None else len(text)]
    elif raw.end is not None:
        arguments = arguments_text(loads_strict(text[raw.start : raw.end]), shape)
    else:
        arguments = ""
    return ObjectCall(CallProgress(name, arguments), None, False)


def _argument_member(scan: ObjectScan, shape: CallShape) -> Member | None:
    for key in shape.argument_keys:
        for member in scan.members:
            if member.key == key:
                return member
    return None


# -- hermes -----------------------------------------------------------------------

START, END, _HERMES_SHAPE = hermes.START, hermes.END, hermes._SHAPE


def hermes_scan(parser: ToolParser, text: str, final: bool) -> Scan:
    first = text.find(START)
    if first < 0:
        held = 0 if final else partial_overlap(text, START)
        return Scan(content=text[: len(text) - held])
    content = text[:first]
    scan = Scan(content=content)
    start = first
    while start >= 0:
        index = skip_ws(text, start + len(START))
        if index >= len(text):
            if final:
                return Scan(content=text, invalid=True)
            break
        if text[index] != "{":
            return Scan(content=text, invalid=True)
        call = scan_call(text, index, _HERMES_SHAPE, final)
        if call.bad:
            return Scan(content=text, invalid=True)
        if call.progress is not None:
            scan.calls.append(call.progress)
        if call.end is None:
            break
        after = skip_ws(text, call.end)
        rest = text[after:]
        if rest.startswith(END):
            after += len(END)
        elif rest and not (END.startswith(rest) and not final):
            return Scan(content=text, invalid=True)
        start = text.find(START, after)
    if final:
        scan.content = content_or_none(content, True) or ""
    return scan


# -- llama3_json ------------------------------------------------------------------

PYTHON_TAG, _LLAMA_SHAPE = llama3_json.PYTHON_TAG, llama3_json._SHAPE


def _calls_start(text: str, final: bool) -> int | None:
    """Where the first object starts: -1 when the text is prose, None while it cannot
    tell yet (only whitespace, or part of the tag)."""
    index = skip_ws(text, 0)
    rest = text[index:]
    if rest.startswith(PYTHON_TAG):
        index = skip_ws(text, index + len(PYTHON_TAG))
        if index < len(text):
            return index if text[index] == "{" else -1
        return -1 if final else None
    if rest.startswith("{"):
        return index
    if not final and PYTHON_TAG.startswith(rest):
        return None
    return -1




def llama3_json_scan(parser: ToolParser, text: str, final: bool) -> Scan:
    start = _calls_start(text, final)
    if start is None:
        return Scan()
    if start < 0:
        return Scan(content=text)
    scan = Scan()
    while start >= 0:
        call = scan_call(text, start, _LLAMA_SHAPE, final)
        if call.bad:
            if not scan.calls:
                return Scan(content=text, invalid=True)
            break
        if call.progress is not None:
            scan.calls.append(call.progress)
        if call.end is None:
            break
        start = text.find("{", call.end)
    return scan


# -- mistral ----------------------------------------------------------------------

BOT, ARGS, _MISTRAL_SHAPE, _NAME = mistral.BOT, mistral.ARGS, mistral._SHAPE, mistral._NAME


def _after_markers(text: str, index: int) -> int:
    """Skip whitespace and repeated `[TOOL_CALLS]` tokens (they count as one)."""
    while True:
        index = skip_ws(text, index)
        if not text.startswith(BOT, index):
            return index
        index += len(BOT)


def mistral_scan(parser: ToolParser, text: str, final: bool) -> Scan:
    first = text.find(BOT)
    if first < 0:
        held = 0 if final else partial_overlap(text, BOT)
        return Scan(content=text[: len(text) - held])
    content = text[:first]
    index = _after_markers(text, first + len(BOT))
    rest = text[index:]
    if not final and (not rest or BOT.startswith(rest)):
        return Scan(content=content)
    if rest[:1] in ("[", "{"):
        calls = _scan_json(text, index, final)
    else:
        calls = _scan_named(text, index, final)
    if calls is None:
        return Scan(content=text.replace(BOT, ""), invalid=True)
    if final:
        content = content_or_none(content, True) or ""
    return Scan(content=content, calls=calls)

def _scan_json(text: str, index: int, final: bool) -> list[CallProgress] | None:
    """The calls of the list (or single object) at `index`; None when it cannot
    hold calls."""
    if text[index] == "{":
        call = scan_call(text, index, _MISTRAL_SHAPE, final)
        if call.bad:
            return None
        return [call.progress] if call.progress else []
    array = scan_array(text, index)
    if array.bad or (array.end is None and (final or not is_valid_prefix(text, index))):
        return None
    calls: list[CallProgress] = []
    for start, end in array.elements:
        if text[start] != "{":
            continue
        call = scan_call(text, start, _MISTRAL_SHAPE, final)
        if call.bad and call.end is None:
            return None
        if call.progress is not None:
            calls.append(call.progress)
        if end is None:
            break
    if array.end is not None:
        try:
            loads_strict(text[index : array.end])
        except ValueError:
            return None
        if not calls:
            return None
    return calls

def _scan_named(text: str, index: int, final: bool) -> list[CallProgress] | None:
    calls: list[CallProgress] = []
    while True:
        split = _name_end(text, index)
        if split is None:
            if not final:
                # A name may still be growing, or `[ARGS]` be half there.
                grown = text[index : len(text) - partial_overlap(text, ARGS)].strip()
                return None if grown and not _NAME.fullmatch(grown) else calls
            name, args_at = text[index:].strip(), len(text)
        else:
            name, args_at = text[index : split[0]].strip(), split[1]
        if not _NAME.fullmatch(name):
            return None
        args_at = skip_ws(text, args_at)
        if args_at >= len(text):
            calls.append(CallProgress(name, "{}" if final else "", final))
            return calls
        if text[args_at] != "{":
            return None
        obj = scan_object(text, args_at)
        if obj.bad:
            return None
        if obj.end is None:
            if final or not is_valid_prefix(text, args_at):
                return None
            calls.append(CallProgress(name, text[args_at:]))
            return calls
        try:
            loads_strict(text[args_at : obj.end])
        except ValueError:
            return None
        calls.append(CallProgress(name, text[args_at : obj.end], complete=True))
        following = text.find(BOT, obj.end)
        if following < 0:
            return calls
        index = _after_markers(text, following + len(BOT))
        if index >= len(text):
            return calls



def _name_end(text: str, index: int) -> tuple[int, int] | None:
    """(end of the name, start of the arguments) of a v11 call starting at `index`."""
    args = text.find(ARGS, index)
    brace = text.find("{", index)
    if args >= 0 and (brace < 0 or args < brace):
        return args, args + len(ARGS)
    if brace >= 0:
        return brace, brace
    return None


# -- pythonic ---------------------------------------------------------------------

_DOTTED, _KEY, _VALUE_STOP = pythonic._DOTTED, pythonic._KEY, pythonic._VALUE_STOP
_NotToolCalls, _literal_json = pythonic._NotToolCalls, pythonic._literal_json


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




def pythonic_scan(parser: ToolParser, text: str, final: bool) -> Scan:
    start = skip_ws(text, 0)
    if start >= len(text):
        return Scan(content=text if final else "")
    if text[start] != "[":
        return Scan(content=text)
    calls: list[CallProgress] = []
    try:
        done = _scan_list(text, start + 1, final, calls)
    except _NotToolCalls:
        return Scan(content=text, invalid=True)
    if final and not done:
        return Scan(content=text, invalid=True)
    return Scan(calls=calls)

def _scan_list(text: str, pos: int, final: bool, calls: list[CallProgress]) -> bool:
    """Append the calls of the list body at `pos`; True once its `]` is reached,
    False while the text may continue it."""
    size = len(text)
    while True:
        pos = skip_ws(text, pos)
        if pos >= size:
            return False
        if calls and text[pos] == "]":
            return True
        name = _DOTTED.match(text, pos)
        if name is None:
            raise _NotToolCalls("expected a call")
        pos = skip_ws(text, name.end())
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
            pos = skip_ws(text, pos)
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
            pos = skip_ws(text, key.end())
            if pos >= size:
                return False
            if key.group() in keys or keyword.iskeyword(key.group()):
                raise _NotToolCalls("repeated or reserved keyword")
            if text[pos] != "=" or text.startswith("==", pos):
                raise _NotToolCalls("expected =")
            if not keys:
                calls.append(call)
            pos = skip_ws(text, pos + 1)
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
        pos = skip_ws(text, pos)
        if pos >= size:
            return False
        if text[pos] == "]":
            return True
        if text[pos] != ",":
            raise _NotToolCalls("expected , or ]")
        pos += 1


# -- tool_schema ------------------------------------------------------------------

_REQUIRED_SHAPE = CallShape(argument_keys=("parameters",))


def required_scan(self: RequiredToolCallParser, text: str, final: bool) -> Scan:
    index = skip_ws(text, 0)
    if index >= len(text):
        return Scan()
    if text[index] != "[":
        return Scan(invalid=True)
    array = scan_array(text, index)
    if array.bad:
        return Scan(invalid=True)
    calls: list[CallProgress] = []
    for start, _ in array.elements:
        call = scan_call(text, start, _REQUIRED_SHAPE, final) if text[start] == "{" else None
        if call is None or call.bad:
            return Scan(invalid=True)
        if call.progress is None:
            break
        calls.append(call.progress)
    if final and (array.end is None or not is_valid_prefix(text, index)):
        return Scan(invalid=True)
    return Scan(calls=calls[: self.limit])


def named_scan(self: NamedToolCallParser, text: str, final: bool) -> Scan:
    if not text.strip():
        return Scan()
    return Scan(calls=[CallProgress(self.function_name, text, complete=final)])


_SCANS = {
    "hermes": hermes_scan,
    "llama3_json": llama3_json_scan,
    "mistral": mistral_scan,
    "pythonic": pythonic_scan,
    "required": required_scan,
    "named": named_scan,
}


def reference_scan(parser: ToolParser, text: str, final: bool) -> Scan:
    """The reading `ToolParser.scan` made of `text` (the whole text, every time)."""
    try:
        return _SCANS[parser.name](parser, text, final)
    except Exception:
        logger.exception("%s tool parser scan failed", parser.name)
        return Scan(content=text, invalid=True)
    finally:
        clear_caches()


# -- the stream -------------------------------------------------------------------------


@dataclass
class _SentCall:
    id: str
    arguments: str


class ReferenceStream:
    """`ToolCallStream` as it was: `feed` re-scans the whole text."""

    def __init__(self, parser: ToolParser) -> None:
        self._parser = parser
        self._text = ""
        self._content = ""
        self._calls: list[_SentCall] = []
        self._finished = False

    def feed(self, delta_text: str) -> list[Delta]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        if not delta_text:
            return []
        self._text += delta_text
        return self._advance(final=False)

    def finish(self) -> list[Delta]:
        if self._finished:
            return []
        self._finished = True
        return self._advance(final=True)

    def _advance(self, final: bool) -> list[Delta]:
        scan = reference_scan(self._parser, self._text, final)
        deltas: list[Delta] = []
        if scan.invalid and self._calls:
            # Calls already sent cannot be taken back: the stream stops where the
            # output left the format.
            return deltas
        content = scan.content
        if not final and not content.strip():
            # Whitespace before a first call is dropped at the end, so it waits.
            content = ""
        if len(content) > len(self._content) and content.startswith(self._content):
            deltas.append(ContentDelta(content[len(self._content) :]))
            self._content = content
        for index, call in enumerate(scan.calls):
            if call.name is None:
                break
            if index == len(self._calls):
                sent = _SentCall(self._parser.make_call_id(), call.arguments)
                self._calls.append(sent)
                deltas.append(ToolCallDelta(index, call.arguments, sent.id, call.name))
                continue
            sent = self._calls[index]
            if len(call.arguments) > len(sent.arguments) and call.arguments.startswith(
                sent.arguments
            ):
                deltas.append(ToolCallDelta(index, call.arguments[len(sent.arguments) :]))
                sent.arguments = call.arguments
        return deltas

