"""Strict tool calls under `tool_choice: "auto"`: a structural tag that leaves the output
free until the model writes the parser's call marker, then holds the call to a declared
function (and, for a strict one, its arguments to the function's `parameters`), as vLLM
0.34 builds it.

Which calls the tag constrains follows vLLM's `resolve_tool_strictness`, with the server's
floor `--tool-strict-level`:

- `auto` (the default): only when some tool sets `strict: true`; then every function's
  call is held to its name, and the strict ones' arguments to their schema;
- `function`: every request with tools gets the tag, arguments free unless the tool is
  strict;
- `parameter`: every tool's arguments are held to its schema, as if all were strict.

`parallel_tool_calls: false` raises the floor to `function` and ends the output after the
first call, as vLLM does. A parser whose format has no marker the tag can trigger on
(`mistral`, `pythonic`, `granite`), or whose arguments are not JSON (`qwen3_coder`'s XML,
Harmony's channels here), gets no tag: `strict` is then ignored, as vLLM ignores it for
parsers without a structural tag. So is a request whose own structured output (or
response_format) constrains the output: that constraint applies (vLLM joins the two into
one grammar where xgrammar can).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from server.frontend.chat.tool_parsers.base import ToolParser

LEVELS = ("auto", "function", "parameter")


def _function(tool: dict[str, Any]) -> dict[str, Any] | None:
    function = tool.get("function")
    if tool.get("type", "function") != "function" or not isinstance(function, dict):
        return None
    return function


def _is_strict(tool: dict[str, Any], function: dict[str, Any]) -> bool:
    return function.get("strict") is True or tool.get("strict") is True


def strict_tool_tag(parser: type[ToolParser], tools: Sequence[dict[str, Any]] | None,
                    level: str | None, parallel_tool_calls: bool | None
                    ) -> dict[str, Any] | None:
    """The structural tag for an "auto" request, None when nothing is constrained."""
    floor = LEVELS.index(level or "auto")
    single = parallel_tool_calls is False
    if single:
        floor = max(floor, LEVELS.index("function"))
    functions = [(t, f) for t in tools or () if (f := _function(t)) is not None]
    if not functions:
        return None
    if floor == 0 and not any(_is_strict(t, f) for t, f in functions):
        return None
    triggers: list[str] = []
    tags = []
    for tool, function in functions:
        marks = parser.call_tags(function["name"])
        if marks is None:
            return None
        strict = floor >= LEVELS.index("parameter") or _is_strict(tool, function)
        schema: dict[str, Any] | bool = True
        if strict:
            schema = function.get("parameters") or {"type": "object", "properties": {}}
        for trigger, begin, end in marks:
            if trigger not in triggers:
                triggers.append(trigger)
            tags.append({"type": "tag", "begin": begin, "end": end,
                         "content": {"type": "json_schema", "json_schema": schema}})
    return {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": triggers, "tags": tags,
        "stop_after_first": single}}
