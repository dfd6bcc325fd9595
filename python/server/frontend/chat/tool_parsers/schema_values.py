"""Typing a parameter value that a model wrote as bare text (Qwen3-Coder's XML parameters)
by the tool's JSON schema, as vLLM 0.34 types them.

The types a schema allows come from `type` (a name or a list), from the values of an
`enum`, and from the branches of `anyOf` / `oneOf` / `allOf`; a schema that says nothing
allows a string. The text becomes the first type, in the order null, integer, number,
boolean, object, array, string, that it reads as; text that reads as none is decoded as
JSON if it can be and kept as a string otherwise. Numbers that JSON cannot hold (`1e999`,
`nan`) stay strings.
"""

from __future__ import annotations

import json
import math
from typing import Any

_ALIASES = {
    "str": "string", "text": "string", "varchar": "string", "char": "string",
    "enum": "string", "int": "integer", "int32": "integer", "int64": "integer",
    "uint": "integer", "long": "integer", "short": "integer", "float": "number",
    "double": "number", "float32": "number", "float64": "number", "bool": "boolean",
    "dict": "object", "map": "object", "list": "array", "none": "null",
}
_ORDER = ("null", "integer", "number", "boolean", "object", "array", "string")


def schema_types(schema: Any) -> frozenset[str]:
    """The JSON types `schema` allows (`string` when it names none)."""
    types: set[str] = set()
    _collect(schema, types)
    return frozenset(types) if types else frozenset({"string"})


def _collect(schema: Any, types: set[str]) -> None:
    if not isinstance(schema, dict):
        return
    named = schema.get("type")
    for name in named if isinstance(named, list) else [named]:
        if isinstance(name, str):
            types.add(_ALIASES.get(name.strip().lower(), name.strip().lower()))
    enum = schema.get("enum")
    if isinstance(enum, list):
        for value in enum:
            types.add(_json_type(value))
    for key in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            for branch in branches:
                _collect(branch, types)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, (dict, list)):
        return "object" if isinstance(value, dict) else "array"
    return "string"


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def _as(kind: str, text: str) -> tuple[bool, Any]:
    """(whether `text` reads as `kind`, the value)."""
    if kind == "null":
        return text.lower() == "null", None
    if kind == "string":
        return True, text
    if kind in ("integer", "number"):
        try:
            return True, int(text)
        except ValueError:
            pass
        if kind == "integer":
            return False, None
        try:
            number = float(text)
        except ValueError:
            return False, None
        if not math.isfinite(number):
            return False, None
        return True, int(number) if number == int(number) else number
    if kind == "boolean":
        lowered = text.strip().lower()
        if lowered in ("true", "1", "false", "0"):
            return True, lowered in ("true", "1")
        return False, None
    try:
        value = json.loads(text)
    except ValueError:
        return False, None
    wanted = dict if kind == "object" else list
    return isinstance(value, wanted) and _finite(value), value


def typed_value(text: str, types: frozenset[str]) -> Any:
    """`text` as the first of `types` it reads as."""
    for kind in _ORDER:
        if kind in types:
            ok, value = _as(kind, text)
            if ok:
                return value
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if _finite(value) else text


def parameter_types(tools: list[dict[str, Any]], function: str) -> dict[str, frozenset[str]]:
    """Each parameter's types for `function` among `tools` (none when it is unknown)."""
    for tool in tools:
        spec = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(spec, dict) and spec.get("name") == function:
            parameters = spec.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, dict) else None
            if isinstance(properties, dict):
                return {key: schema_types(schema) for key, schema in properties.items()}
            return {}
    return {}
