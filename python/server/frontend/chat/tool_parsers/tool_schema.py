"""Forced tool choice: the JSON schema that constrains generation for `tool_choice:
"required"` or a named function, and the reading of the constrained output back into
calls, as vLLM does it for parsers that take the generic JSON path.

- A named function: the output is that function's arguments object, so the schema is
  its `parameters` (an empty object schema when it declares none); the whole output is
  the call's arguments.
- `"required"`: the output is a JSON array of `{"name": ..., "parameters": {...}}`, at
  least one item, each item one of the tools (the name pinned by `enum`); with
  `parallel_tool_calls: false`, at most one. `$defs` of every tool move to the top of
  the schema, where their `#/$defs/...` references resolve; two tools defining one name
  differently are refused.

`RequiredToolCallParser` and `NamedToolCallParser` read such output through the same
interface as the auto parsers, so one code path streams every kind of tool choice.
"""

from __future__ import annotations

import copy
from typing import Any

from server.frontend.chat.tool_parsers import _json_scan as js
from server.frontend.chat.tool_parsers._json_calls import (
    CallScanner,
    CallShape,
    arguments_text,
    decode_call,
)
from server.frontend.chat.tool_parsers.base import (
    CallProgress,
    ParsedToolCalls,
    Scan,
    Scanner,
    ToolCall,
    ToolParser,
)

_EMPTY_OBJECT = {"type": "object", "properties": {}}
_REQUIRED_SHAPE = CallShape(argument_keys=("parameters",))


class ToolChoiceError(ValueError):
    pass


def _functions(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [t["function"] for t in tools or [] if t.get("type", "function") == "function"]


def named_function(tool_choice: Any) -> str | None:
    """The function a `{"type": "function", "function": {"name": ...}}` choice names."""
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return function["name"]
    return None


def tool_choice_schema(
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    parallel_tool_calls: bool | None = None,
) -> dict[str, Any] | None:
    """The schema for the output, None when the choice does not constrain it ("auto",
    "none", absent)."""
    if tool_choice in (None, "none", "auto") or tools is None:
        return None
    functions = _functions(tools)
    name = named_function(tool_choice)
    if name is not None:
        for function in functions:
            if function["name"] == name:
                return copy.deepcopy(function.get("parameters") or _EMPTY_OBJECT)
        raise ToolChoiceError(f"Tool '{name}' has not been passed in `tools`.")
    if tool_choice != "required":
        return None
    definitions: dict[str, Any] = {}
    items = []
    for function in functions:
        parameters = copy.deepcopy(function.get("parameters") or _EMPTY_OBJECT)
        defs = parameters.pop("$defs", {})
        if not isinstance(defs, dict):
            raise ToolChoiceError(
                f"`$defs` in the parameters of tool '{function['name']}' must be an object."
            )
        for key, schema in defs.items():
            if key in definitions and definitions[key] != schema:
                raise ToolChoiceError(
                    f"Tool definition '{key}' has multiple schemas, which is not supported."
                )
            definitions[key] = schema
        items.append(
            {
                "properties": {
                    "name": {"type": "string", "enum": [function["name"]]},
                    "parameters": parameters,
                },
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "anyOf": items},
    }
    # Only an explicit false limits the calls: an absent field means parallel calls.
    if parallel_tool_calls is False:
        schema["maxItems"] = 1
    if definitions:
        schema["$defs"] = definitions
    return schema


class RequiredToolCallParser(ToolParser):
    """Reads the `"required"` array. An array cut short (by max_tokens: a small model can
    repeat calls until the limit) gives its complete elements; vLLM drops them all, and
    agent SDKs then fail on an empty message. Other output that is not such an array has
    no calls and no content, as vLLM returns it."""

    name = "required"

    def __init__(self, parallel_tool_calls: bool | None = None) -> None:
        super().__init__()
        self.limit = 1 if parallel_tool_calls is False else None

    def _parse(self, text: str) -> ParsedToolCalls:
        try:
            items = js.loads_strict(text.strip() or "[]")
        except ValueError:
            return ParsedToolCalls(content=None, calls=self._complete_calls(text))
        if not isinstance(items, list):
            return ParsedToolCalls(content=None)
        pairs = []
        for item in items:
            call = decode_call(item, _REQUIRED_SHAPE)
            if call is None:
                return ParsedToolCalls(content=None)
            pairs.append(call)
        return ParsedToolCalls(content=None, calls=self._calls(pairs[: self.limit]))

    def new_scanner(self) -> Scanner:
        return ArrayCallsScanner(self.name, self.limit)

    def _complete_calls(self, text: str) -> list[ToolCall]:
        """The calls of an array that stops early (max_tokens cut it): its complete
        elements, read as a stream reads them; the cut element is no call."""
        scan = self.new_scanner().advance(text, final=False)
        if scan.invalid:
            return []
        pairs = [(call.name, call.arguments_in(text)) for call in scan.calls
                 if call.complete and call.name is not None]
        # The streamed form of an object is its raw text; the whole response's, re-encoded.
        return self._calls([(name, _reencoded(arguments)) for name, arguments in pairs])


class ArrayCallsScanner(Scanner):
    """A JSON array of call objects from `start` of a growing text, read on from where the
    last advance stopped; finished elements are kept as calls, only the current one is
    read. `strict`: the final text must be the array alone (the `"required"` output);
    otherwise text after it is dropped, and an array the text cut short still has its
    complete elements."""

    def __init__(self, parser_name: str, limit: int | None, shape: CallShape = _REQUIRED_SHAPE,
                 start: int = 0, strict: bool = True) -> None:
        super().__init__(parser_name)
        self._limit = limit
        self._shape = shape
        self._strict = strict
        self._pos = start
        self._array: js.JsonValue | None = None
        self._element = 0  # the element being read
        self._call: CallScanner | None = None
        self._calls: list[CallProgress] = []

    def _advance(self, text: str, final: bool) -> Scan:
        if self._array is None:
            index = self._pos = js.skip_ws(text, self._pos)
            if index >= len(text):
                return Scan(invalid=final and not self._strict)
            if text[index] != "[":
                return Scan(invalid=True)
            self._array = js.JsonValue(index, members=True)
        array = self._array
        array.advance(text)
        if array.bad:
            return self._stopped()
        elements = array.members
        open_call = None
        while self._element < len(elements):
            element = elements[self._element]
            if text[element.start] != "{":
                return self._stopped()
            if self._call is None:
                self._call = CallScanner(element.start, self._shape)
            call = self._call.advance(text, final)
            if call.bad:
                if final and not self._strict and call.end is None:
                    break  # the element the text cut short
                return self._stopped()
            if call.end is None:
                open_call = call.progress
                break
            assert call.progress is not None
            self._calls.append(call.progress)
            self._element += 1
            self._call = None
        if final:
            if self._strict and (array.end is None or text[array.end :].strip()):
                return Scan(invalid=True)
            if not self._calls:
                return Scan(invalid=True)
            open_call = None
        if self._limit is not None and len(self._calls) >= self._limit:
            return Scan(calls=self._calls[: self._limit])
        return Scan(calls=self._calls, open_call=open_call)

    def _stopped(self) -> Scan:
        """Output that left the format: the calls before it, when that is allowed."""
        if self._strict or not self._calls:
            return Scan(invalid=True)
        return Scan(calls=self._calls[: self._limit])


class NamedToolCallParser(ToolParser):
    """Reads a named function's arguments: the whole output is the arguments text, sent
    as it arrives; an empty output is no call."""

    name = "named"

    def __init__(self, function_name: str) -> None:
        super().__init__()
        self.function_name = function_name

    def _parse(self, text: str) -> ParsedToolCalls:
        if not text.strip():
            return ParsedToolCalls(content=None)
        return ParsedToolCalls(content=None, calls=self._calls([(self.function_name, text)]))

    def new_scanner(self) -> Scanner:
        return _NamedScanner(self.name, self.function_name)


class _NamedScanner(Scanner):
    def __init__(self, parser_name: str, function_name: str) -> None:
        super().__init__(parser_name)
        self._function_name = function_name
        self._blank_to = 0  # the text before this is whitespace
        self._started = False

    def _advance(self, text: str, final: bool) -> Scan:
        if not self._started:
            self._blank_to = js.skip_ws(text, self._blank_to)
            if self._blank_to >= len(text):
                return Scan()
            self._started = True
        return Scan(open_call=CallProgress(self._function_name, complete=final,
                                           span=(0, len(text))))


def _reencoded(arguments: str) -> str:
    return arguments_text(js.loads_strict(arguments), _REQUIRED_SHAPE)


def forced_tool_parser(
    tool_choice: Any, parallel_tool_calls: bool | None = None
) -> ToolParser | None:
    """The parser for a forced choice's output, None for "auto" and "none"."""
    name = named_function(tool_choice)
    if name is not None:
        return NamedToolCallParser(name)
    if tool_choice == "required":
        return RequiredToolCallParser(parallel_tool_calls)
    return None
