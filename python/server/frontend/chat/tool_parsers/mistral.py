"""The Mistral format: calls follow the `[TOOL_CALLS]` token, either as a JSON list
`[{"name": ..., "arguments": {...}}, ...]` (tokenizers before v11; a single object is one
call) or, from v11, as `name[ARGS]{...}` (or `name{...}`) with `[TOOL_CALLS]` again
before each further call. Which one is read off the text after the token.

What is kept, as vLLM's `mistral` parser keeps it: the text before `[TOOL_CALLS]` is the
content (none when only whitespace); text after the list, or after a call's arguments,
is dropped; list entries that are not call objects are skipped; a string `arguments` is
the arguments text as written, and missing arguments are `{}`. Output after the token
that holds no call is returned as content without the token.

Ids are 9 letters and digits: Mistral's chat format rejects any other id when the
conversation comes back with the tool results.
"""

from __future__ import annotations

import random
import re
import string

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
    partial_overlap,
)

BOT = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_SHAPE = CallShape(
    argument_keys=("arguments",), missing_arguments="{}", string_arguments_as_text=True
)
_ALPHANUMERIC = string.ascii_letters + string.digits
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_random = random.SystemRandom()


def make_mistral_call_id() -> str:
    return "".join(_random.choices(_ALPHANUMERIC, k=9))


def _after_markers(text: str, index: int) -> int:
    """Skip whitespace and repeated `[TOOL_CALLS]` tokens (they count as one)."""
    while True:
        index = js.skip_ws(text, index)
        if not text.startswith(BOT, index):
            return index
        index += len(BOT)


class MistralToolParser(ToolParser):
    name = "mistral"
    keeps_special_tokens = True

    def make_call_id(self) -> str:
        return make_mistral_call_id()

    # -- finished text ----------------------------------------------------------------

    def _parse(self, text: str) -> ParsedToolCalls:
        first = text.find(BOT)
        if first < 0:
            return ParsedToolCalls(content=text)
        index = _after_markers(text, first + len(BOT))
        if index < len(text) and text[index] in "[{":
            pairs = self._parse_json(text, index)
        else:
            pairs = self._parse_named(text, index)
        if not pairs:
            return ParsedToolCalls(content=text.replace(BOT, ""))
        return ParsedToolCalls(content_or_none(text[:first], True), self._calls(pairs))

    @staticmethod
    def _parse_json(text: str, index: int) -> list[tuple[str, str]]:
        try:
            value, _ = js.raw_decode_strict(text, index)
        except ValueError:
            return []
        entries = value if isinstance(value, list) else [value]
        return [call for call in (decode_call(e, _SHAPE) for e in entries) if call]

    @staticmethod
    def _parse_named(text: str, index: int) -> list[tuple[str, str]]:
        pairs: list[tuple[str, str]] = []
        while True:
            split = _name_end(text, index)
            if split is None:
                name, args_at = text[index:].strip(), len(text)
            else:
                name, args_at = text[index : split[0]].strip(), split[1]
            if not _NAME.fullmatch(name):
                return []
            args_at = js.skip_ws(text, args_at)
            if args_at >= len(text):
                pairs.append((name, "{}"))
                return pairs
            try:
                value, end = js.raw_decode_strict(text, args_at)
            except ValueError:
                return []
            if not isinstance(value, dict):
                return []
            pairs.append((name, text[args_at:end]))
            following = text.find(BOT, end)
            if following < 0:
                return pairs
            index = _after_markers(text, following + len(BOT))
            if index >= len(text):
                return pairs

    # -- growing text -----------------------------------------------------------------

    def new_scanner(self) -> Scanner:
        return _MistralScanner(self.name)


_Calls = tuple[list[CallProgress], CallProgress | None]  # finished calls, the open one
# Where the reading of the v11 form stands.
_NAME_STAGE, _ARGS_STAGE, _NEXT_STAGE = range(3)


class _MistralScanner(TaggedScanner):
    """After `[TOOL_CALLS]`, once the first character tells the form, the JSON list (or
    object) or the v11 calls are read on from where the last advance stopped: finished
    calls are kept, only the current one is read."""

    def __init__(self, parser_name: str) -> None:
        super().__init__(parser_name, BOT)
        self._index = 0  # where the calls start, past the markers
        self._form: str | None = None  # "json" or "named" once the text tells
        self._calls: list[CallProgress] = []
        # The JSON form.
        self._object: CallScanner | None = None  # the single object, or the current element
        self._array: js.JsonValue | None = None
        self._element = 0  # the array element being read
        # The v11 form.
        self._stage = _NAME_STAGE
        self._markers_from = 0  # where the markers before the current name start
        self._name = ""
        self._arguments: js.JsonValue | None = None

    def _read(self, text: str, final: bool) -> Scan:
        size = len(text)
        if self._form is None:
            index = self._pos = _after_markers(text, self._pos)
            if not final and (
                index >= size or (size - index < len(BOT) and BOT.startswith(text[index:]))
            ):
                return Scan(content_end=self._first)
            self._form = "json" if text[index : index + 1] in ("[", "{") else "named"
            self._index = self._markers_from = index
        if self._form == "json":
            calls = self._json(text, final)
        else:
            calls = self._named(text, final)
        if calls is None:
            return Scan(content=text.replace(BOT, ""), invalid=True)
        return self._with_calls(text, final, *calls)

    def _json(self, text: str, final: bool) -> _Calls | None:
        """The calls of the list (or single object) at the index; None when it cannot
        hold calls."""
        index = self._index
        if text[index] == "{":
            if self._object is None:
                self._object = CallScanner(index, _SHAPE)
            call = self._object.advance(text, final)
            if call.bad:
                return None
            return self._calls, call.progress
        if self._array is None:
            self._array = js.JsonValue(index, members=True)
        array = self._array
        array.advance(text)
        if array.bad or (array.end is None and final):
            return None
        elements = array.members
        open_call = None
        while self._element < len(elements):
            element = elements[self._element]
            if text[element.start] != "{":
                if element.end is None:
                    break
                self._element += 1
                continue
            if self._object is None:
                self._object = CallScanner(element.start, _SHAPE)
            call = self._object.advance(text, final)
            if call.bad and call.end is None:
                return None
            if element.end is None:
                open_call = call.progress
                break
            if call.progress is not None:
                self._calls.append(call.progress)
            self._element += 1
            self._object = None
        if array.end is not None and not self._calls:
            return None  # no calls (a closed list is valid JSON: `JsonValue` checked it)
        return self._calls, open_call

    def _named(self, text: str, final: bool) -> _Calls | None:
        """The v11 calls: `name[ARGS]{...}` (or `name{...}`), `[TOOL_CALLS]` between."""
        size = len(text)
        while True:
            if self._stage == _NAME_STAGE:
                index = _after_markers(text, self._markers_from)
                if index >= size and self._calls:
                    return self._calls, None  # the next name has not begun
                split = _name_end(text, index)
                if split is None:
                    if not final:
                        # A name may still be growing, or `[ARGS]` be half there.
                        grown = text[index : size - partial_overlap(text, ARGS)].strip()
                        if grown and not _NAME.fullmatch(grown):
                            return None
                        return self._calls, None
                    name, args_at = text[index:].strip(), size
                else:
                    name, args_at = text[index : split[0]].strip(), split[1]
                if not _NAME.fullmatch(name):
                    return None
                args_at = js.skip_ws(text, args_at)
                if args_at >= size:
                    return self._calls, CallProgress(name, "{}" if final else "", final)
                if text[args_at] != "{":
                    return None
                self._name, self._arguments = name, js.JsonValue(args_at)
                self._stage = _ARGS_STAGE
            if self._stage == _ARGS_STAGE:
                arguments = self._arguments
                assert arguments is not None
                arguments.advance(text)
                if arguments.bad:
                    return None
                if arguments.end is None:
                    if final:
                        return None
                    return self._calls, CallProgress(self._name, span=(arguments.start, size))
                self._calls.append(
                    CallProgress(self._name, complete=True, span=(arguments.start, arguments.end))
                )
                self._stage, self._pos = _NEXT_STAGE, arguments.end
            following = self._find_tag(text)
            if following < 0:
                return self._calls, None
            self._stage, self._markers_from = _NAME_STAGE, following + len(BOT)


def _name_end(text: str, index: int) -> tuple[int, int] | None:
    """(end of the name, start of the arguments) of a v11 call starting at `index`."""
    args = text.find(ARGS, index)
    brace = text.find("{", index)
    if args >= 0 and (brace < 0 or args < brace):
        return args, args + len(ARGS)
    if brace >= 0:
        return brace, brace
    return None
