"""Reading one function call written as a JSON object (`{"name": ..., "arguments": ...}`),
both ways the parsers need: decoded from a finished text, and scanned from a text that
may still be growing. Hermes, llama3_json, mistral and the required-tool-choice array
differ only in the keys and in what a missing or string `arguments` means.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from server.api.openai.tool_parsers import _json_scan as js
from server.api.openai.tool_parsers.base import CallProgress


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
    bad: bool  # the text can no longer become a call


def scan_call(text: str, index: int, shape: CallShape, final: bool) -> ObjectCall:
    """The call whose `{` is at `index`, as far as the text makes it certain.

    An object arguments value streams as its raw text, which is a prefix of the final
    value at every step; any other value (a string, say) is sent whole once complete,
    in the same form `decode_call` gives it.
    """
    scan = js.scan_object(text, index)
    if scan.bad:
        return ObjectCall(None, None, True)
    if scan.end is not None:
        # Complete: the strict decoder settles it.
        try:
            decoded = decode_call(js.loads_strict(text[index : scan.end]), shape)
        except ValueError:
            decoded = None
        if decoded is None:
            return ObjectCall(None, scan.end, True)
        name, arguments = decoded
        raw = _argument_member(scan, shape)
        if raw is not None and text[raw.start] == "{":
            arguments = text[raw.start : raw.end]
        return ObjectCall(CallProgress(name, arguments, complete=True), scan.end, False)
    if final or not js.is_valid_prefix(text, index):
        return ObjectCall(None, None, True)
    name = None
    for member in scan.members:
        if member.key == "name" and member.end is not None:
            try:
                value = js.loads_strict(text[member.start : member.end])
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
        arguments = arguments_text(js.loads_strict(text[raw.start : raw.end]), shape)
    else:
        arguments = ""
    return ObjectCall(CallProgress(name, arguments), None, False)


def _argument_member(scan: js.ObjectScan, shape: CallShape) -> js.Member | None:
    for key in shape.argument_keys:
        for member in scan.members:
            if member.key == key:
                return member
    return None
