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
from server.frontend.chat.tool_parsers.deepseek import DeepSeekV3ToolParser, DeepSeekV31ToolParser
from server.frontend.chat.tool_parsers.granite import GraniteToolParser
from server.frontend.chat.tool_parsers.harmony import HarmonyToolParser
from server.frontend.chat.tool_parsers.hermes import HermesToolParser
from server.frontend.chat.tool_parsers.llama3_json import Llama3JsonToolParser
from server.frontend.chat.tool_parsers.mistral import MistralToolParser
from server.frontend.chat.tool_parsers.pythonic import PythonicToolParser
from server.frontend.chat.tool_parsers.qwen3_coder import Qwen3CoderToolParser

# Aliases, as vLLM registers them: `llama4_json` is llama3_json's format, `qwen3_json`
# Hermes', `qwen3_xml` Qwen3-Coder's; `gpt_oss` is the name gpt-oss's reasoning parser
# also answers to, for `openai`.
TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "deepseek_v3": DeepSeekV3ToolParser,
    "deepseek_v31": DeepSeekV31ToolParser,
    "gpt_oss": HarmonyToolParser,
    "granite": GraniteToolParser,
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "llama4_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "openai": HarmonyToolParser,
    "pythonic": PythonicToolParser,
    "qwen3_coder": Qwen3CoderToolParser,
    "qwen3_json": HermesToolParser,
    "qwen3_xml": Qwen3CoderToolParser,
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
    "DeepSeekV3ToolParser",
    "DeepSeekV31ToolParser",
    "Delta",
    "GraniteToolParser",
    "HarmonyToolParser",
    "HermesToolParser",
    "Llama3JsonToolParser",
    "MistralToolParser",
    "ParsedToolCalls",
    "PythonicToolParser",
    "Qwen3CoderToolParser",
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
