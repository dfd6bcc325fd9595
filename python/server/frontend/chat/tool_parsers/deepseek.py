"""DeepSeek's tool calls, between full-width special tokens (`deepseek_v3`, `deepseek_v31`,
the names vLLM registers):

V3 (and R1), each call a type, the name and a fenced JSON block:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

V3.1 drops the type and the fence:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

The arguments are the JSON object as written (vLLM keeps them so too), streamed as they
arrive. Unlike vLLM, which also keeps text after `<｜tool▁calls▁end｜>` as content, that
text is dropped here, as every parser of this package drops text after its calls.
"""

from __future__ import annotations

from server.frontend.chat.tool_parsers._framed import (
    Frame,
    FramedScanner,
    FramedToolParser,
    JsonBody,
)
from server.frontend.chat.tool_parsers.base import Scanner

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"


def _v3_name(header: str) -> str | None:
    """`function<｜tool▁sep｜>NAME` (then a newline before the fence)."""
    kind, sep, name = header.partition(SEP)
    name = name.strip()
    if not sep or kind.strip() != "function" or not name or "\n" in name:
        return None
    return name


def _v31_name(header: str) -> str | None:
    name = header.strip()
    return name if name and "\n" not in name and "<｜" not in name else None


V3 = Frame(opener=CALLS_BEGIN, call_begin=CALL_BEGIN, header_end="```json",
           closers=("```", CALL_END), calls_end=CALLS_END, name_of=_v3_name)
V31 = Frame(opener=CALLS_BEGIN, call_begin=CALL_BEGIN, header_end=SEP,
            closers=(CALL_END,), calls_end=CALLS_END, name_of=_v31_name)


class DeepSeekV3ToolParser(FramedToolParser):
    name = "deepseek_v3"

    @classmethod
    def call_tags(cls, function: str) -> list[tuple[str, str, str]]:
        return [(CALL_BEGIN, f"{CALL_BEGIN}function{SEP}{function}\n```json\n",
                 f"\n```{CALL_END}")]

    def new_scanner(self) -> Scanner:
        return FramedScanner(self.name, V3, JsonBody)


class DeepSeekV31ToolParser(FramedToolParser):
    name = "deepseek_v31"

    @classmethod
    def call_tags(cls, function: str) -> list[tuple[str, str, str]]:
        return [(CALL_BEGIN, f"{CALL_BEGIN}{function}{SEP}", CALL_END)]

    def new_scanner(self) -> Scanner:
        return FramedScanner(self.name, V31, JsonBody)
