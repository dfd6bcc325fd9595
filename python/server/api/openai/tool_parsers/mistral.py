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

from server.api.openai.tool_parsers import _json_scan as js
from server.api.openai.tool_parsers._json_calls import CallShape, decode_call, scan_call
from server.api.openai.tool_parsers.base import (
    CallProgress,
    ParsedToolCalls,
    Scan,
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

    def _scan(self, text: str, final: bool) -> Scan:
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
            calls = self._scan_json(text, index, final)
        else:
            calls = self._scan_named(text, index, final)
        if calls is None:
            return Scan(content=text.replace(BOT, ""), invalid=True)
        if final:
            content = content_or_none(content, True) or ""
        return Scan(content=content, calls=calls)

    @staticmethod
    def _scan_json(text: str, index: int, final: bool) -> list[CallProgress] | None:
        """The calls of the list (or single object) at `index`; None when it cannot
        hold calls."""
        if text[index] == "{":
            call = scan_call(text, index, _SHAPE, final)
            if call.bad:
                return None
            return [call.progress] if call.progress else []
        array = js.scan_array(text, index)
        if array.bad or (array.end is None and (final or not js.is_valid_prefix(text, index))):
            return None
        calls: list[CallProgress] = []
        for start, end in array.elements:
            if text[start] != "{":
                continue
            call = scan_call(text, start, _SHAPE, final)
            if call.bad and call.end is None:
                return None
            if call.progress is not None:
                calls.append(call.progress)
            if end is None:
                break
        if array.end is not None:
            try:
                js.loads_strict(text[index : array.end])
            except ValueError:
                return None
            if not calls:
                return None
        return calls

    @staticmethod
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
            args_at = js.skip_ws(text, args_at)
            if args_at >= len(text):
                calls.append(CallProgress(name, "{}" if final else "", final))
                return calls
            if text[args_at] != "{":
                return None
            obj = js.scan_object(text, args_at)
            if obj.bad:
                return None
            if obj.end is None:
                if final or not js.is_valid_prefix(text, args_at):
                    return None
                calls.append(CallProgress(name, text[args_at:]))
                return calls
            try:
                js.loads_strict(text[args_at : obj.end])
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
