"""Tool-call parsers for `tool_choice: "auto"`, selected by `--tool-call-parser NAME`
together with `--enable-auto-tool-choice` (the flags and names vLLM's `serve` uses).

Each parser splits a choice's generated text into content and function calls, whole
(`parse`) or as it streams (`new_stream()`, then `feed` per text delta and `finish`; the
stream's `Scanner` reads each delta once, from where the last one stopped).
`tool_schema` holds the other half of tool choice: the JSON schema that constrains
output for `"required"` or a named function, and the reading of that output.

It depends on nothing else in the server; the chat route takes it up through
`server.frontend.chat.tools` (the request) and `tool_calls` (the response).
"""

from __future__ import annotations

from server.frontend.chat.tool_parsers.base import (
    CallProgress,
    ContentDelta,
    Delta,
    ParsedToolCalls,
    Scan,
    Scanner,
    ToolCall,
    ToolCallDelta,
    ToolCallStream,
    ToolParser,
    make_tool_call_id,
)
from server.frontend.chat.tool_parsers.hermes import HermesToolParser
from server.frontend.chat.tool_parsers.llama3_json import Llama3JsonToolParser
from server.frontend.chat.tool_parsers.mistral import MistralToolParser
from server.frontend.chat.tool_parsers.pythonic import PythonicToolParser

# `llama4_json` is the same format under the name vLLM also registers it by.
TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "llama4_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "pythonic": PythonicToolParser,
}


class UnknownToolParserError(ValueError):
    pass


def tool_parser_names() -> list[str]:
    return sorted(TOOL_PARSERS)


def get_tool_parser(name: str) -> type[ToolParser]:
    """The parser class registered as `name`."""
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise UnknownToolParserError(
            f"invalid tool call parser: {name} (chose from {{ {','.join(tool_parser_names())} }})"
        ) from None


def check_tool_parser_flags(enable_auto_tool_choice: bool, tool_call_parser: str | None) -> None:
    """The start-up checks of the two flags, worded as vLLM's CLI words them."""
    if not enable_auto_tool_choice:
        return
    if not tool_call_parser:
        raise UnknownToolParserError("Error: --enable-auto-tool-choice requires --tool-call-parser")
    get_tool_parser(tool_call_parser)


__all__ = [
    "TOOL_PARSERS",
    "CallProgress",
    "ContentDelta",
    "Delta",
    "HermesToolParser",
    "Llama3JsonToolParser",
    "MistralToolParser",
    "ParsedToolCalls",
    "PythonicToolParser",
    "Scan",
    "Scanner",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallStream",
    "ToolParser",
    "UnknownToolParserError",
    "check_tool_parser_flags",
    "get_tool_parser",
    "make_tool_call_id",
    "tool_parser_names",
]
