"""Reading one function call written as a JSON object (`{"name": ..., "arguments": ...}`),
both ways the parsers need: decoded from a finished text, and scanned from a text that
may still be growing (`CallScanner`, which reads each part of the text once). Hermes,
llama3_json, mistral and the required-tool-choice array differ only in the keys and in
what a missing or string `arguments` means.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from server.frontend.chat.tool_parsers import _json_scan as js
from server.frontend.chat.tool_parsers.base import CallProgress


@dataclass(frozen=True)
class CallShape:
    argument_keys: tuple[str, ...] = ("arguments",)
    # The arguments to use when the object has none; None makes such an object no call.
    missing_arguments: str | None = None
    # A string `arguments` is taken as the arguments text itself rather than a JSON
    # string value (Mistral models write both).
    string_arguments_as_text: bool = False


def arguments_text(value: Any, shape: CallShape) -> str:
    if shape.string_arguments_as_text and isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def decode_call(obj: Any, shape: CallShape) -> tuple[str, str] | None:
    """(name, arguments JSON) of a decoded object, None when it is not a call."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    for key in shape.argument_keys:
        if key in obj:
            return obj["name"], arguments_text(obj[key], shape)
    if shape.missing_arguments is None:
        return None
    return obj["name"], shape.missing_arguments


@dataclass
class ObjectCall:
    progress: CallProgress | None  # None until a complete name is known
    end: int | None  # just past the object, None while it is open
    bad: bool  # the text cannot be a call now


_BAD = ObjectCall(None, None, True)
_NOT_YET = ObjectCall(None, None, False)


class CallScanner:
    """The call whose `{` is at `index` of a growing text, as far as the text makes it
    certain; `advance` reads only what arrived since the last one.

    An object arguments value streams as its raw text (a span of the text), which is a
    prefix of the final value at every step; any other value (a string, say) is sent
    whole once complete, in the same form `decode_call` gives it. While the object is
    open, every complete `name` must be a string; once it closes, the strict decoder
    settles it.
    """

    __slots__ = (
        "_arguments",
        "_bad_name",
        "_done",
        "_name",
        "_named",
        "_rank",
        "_raw",
        "_seen",
        "_shape",
        "_value",
        "index",
    )

    def __init__(self, index: int, shape: CallShape) -> None:
        self.index = index
        self._shape = shape
        self._value = js.JsonValue(index, members=True)
        self._done: ObjectCall | None = None  # the result once the object has closed
        self._raw: js.Member | None = None  # the arguments member
        self._rank = len(shape.argument_keys)  # its key's place in argument_keys
        self._arguments: str | None = None  # a complete non-object arguments value, as text
        self._seen = 0  # members looked at for the arguments member
        self._named = 0  # members whose complete value was looked at for the name
        self._name: str | None = None
        self._bad_name = False

    def advance(self, text: str, final: bool) -> ObjectCall:
        if self._done is not None:
            return self._done
        value = self._value
        value.advance(text)
        if value.bad:
            return _BAD
        members = value.members
        keys = self._shape.argument_keys
        for member in members[self._seen :]:
            # The first member of the most preferred argument key.
            if member.key in keys and keys.index(member.key) < self._rank:
                self._raw, self._rank, self._arguments = member, keys.index(member.key), None
        self._seen = len(members)
        if value.end is not None:
            self._done = self._decode(text, value.end)
            return self._done
        if final:
            return _BAD
        while self._named < len(members) and members[self._named].end is not None:
            member = members[self._named]
            self._named += 1
            if member.key == "name":
                name = js.loads_strict(text[member.start : member.end])
                if isinstance(name, str):
                    self._name = name
                else:
                    self._bad_name = True
        if self._bad_name:
            return _BAD
        raw = self._raw
        if self._name is None or raw is None:
            return _NOT_YET
        if text[raw.start] == "{":
            end = raw.end if raw.end is not None else len(text)
            return ObjectCall(CallProgress(self._name, span=(raw.start, end)), None, False)
        if raw.end is None:
            return ObjectCall(CallProgress(self._name), None, False)
        if self._arguments is None:
            self._arguments = arguments_text(
                js.loads_strict(text[raw.start : raw.end]), self._shape
            )
        return ObjectCall(CallProgress(self._name, self._arguments), None, False)

    def _decode(self, text: str, end: int) -> ObjectCall:
        try:
            decoded = decode_call(js.loads_strict(text[self.index : end]), self._shape)
        except ValueError:
            decoded = None
        if decoded is None:
            return ObjectCall(None, end, True)
        name, arguments = decoded
        raw = self._raw
        if raw is not None and text[raw.start] == "{":
            return ObjectCall(CallProgress(name, complete=True, span=(raw.start, raw.end)),
                              end, False)
        return ObjectCall(CallProgress(name, arguments, complete=True), end, False)
