"""Reasoning parsers: the split of a choice's text into reasoning and content, whole or as
it streams, for `--reasoning-parser NAME` (the names vLLM 0.34 registers).

The layer is pure and in no dialect's shape: each dialect (chat `message.reasoning` and
`delta.reasoning`, Anthropic thinking blocks, Responses reasoning items) shapes what it
gets. A parser is built per request, `get(name)(chat_template_kwargs, prompt)`, and reads
a text by `split(text) -> (reasoning, content)` or by `stream()`, whose `feed(delta,
token_ids)` answers `(reasoning_delta, content_delta)` and counts reasoning tokens
(`base` says how the two readings are kept apart and how markers cut across deltas are
held back). The streamed pieces, joined, equal `split` however the text is cut, and no
marker, or part of one, reaches either side; a marker prefix the text ends in is text.

Built in (one table, `register` adds to it; `names()` lists it):

- `deepseek_r1`, `qwen3`, `mistral`: `<think>…</think>` / `[THINK]…[/THINK]`
  (`think_tags`);
- `granite`: "Here is my thought process:" / "Here is my response:" (`granite`);
- `openai_gptoss`, and `gpt_oss` for it: Harmony channels (`harmony`).

Plugins: a distribution may add parsers through the `llmserve.reasoning_parsers` entry
point group, each entry naming a `ReasoningParser` subclass (`name = "module:Class"`);
the group is read only when a name is not in the table, or when the names are listed.

Where the rules differ from vLLM 0.34's, and why (all so that a streamed choice and the
same text read whole agree, and no marker reaches the client):

- Tags in the wrong place: vLLM's DeepSeek-R1 reader passes a `</think>` inside content,
  and its Qwen3 grammar a `<think>` there, through as text, and R1's whole reading drops
  everything before a `<think>`. Here a stray end tag is dropped, a start tag in content
  opens reasoning again (as vLLM's Mistral grammar does) and text before a `<think>` is
  reasoning, streamed or not.
- Granite: vLLM's whole reading takes an unclosed thought process, and a thought-process
  marker anywhere, as content, while its stream makes them reasoning and requires the
  marker at the start; here both readings follow the stream.
- gpt-oss: vLLM joins a side's messages with "\\n" when reading whole and with nothing
  when streaming; here both join with "\\n". vLLM reads Harmony by token ids; here the
  text is read, so special tokens must be detokenized (not skipped), as vLLM also
  requires of its grammar parsers.
- Mistral: whitespace ending reasoning is dropped per stretch of reasoning (vLLM strips
  the end of all reasoning when reading whole, per stretch when streaming). Only the
  `[THINK]` spelling is read; vLLM picks `<think>` for v11 tokenizers without `[THINK]`.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from server.frontend.chat.reasoning.base import (
    GateRule,
    MarkerStream,
    Pair,
    ReasoningParser,
    ReasoningStream,
    Split,
)
from server.frontend.chat.reasoning.granite import GraniteParser
from server.frontend.chat.reasoning.harmony import HarmonyParser
from server.frontend.chat.reasoning.think_tags import (
    DeepSeekR1Parser,
    MistralParser,
    Qwen3Parser,
    ThinkTagParser,
)

ENTRY_POINT_GROUP = "llmserve.reasoning_parsers"

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "deepseek_r1": DeepSeekR1Parser,
    "qwen3": Qwen3Parser,
    "mistral": MistralParser,
    "granite": GraniteParser,
    "openai_gptoss": HarmonyParser,
    "gpt_oss": HarmonyParser,
}


class UnknownReasoningParserError(ValueError):
    pass


def register(name: str, parser: type[ReasoningParser]) -> None:
    """Add `parser` under `name`; a name already taken by another class is refused."""
    if not (isinstance(parser, type) and issubclass(parser, ReasoningParser)):
        raise TypeError(f"reasoning parser {name!r} is not a ReasoningParser subclass: {parser!r}")
    taken = REASONING_PARSERS.get(name)
    if taken is not None and taken is not parser:
        raise ValueError(f"reasoning parser {name!r} is already registered ({taken.__name__})")
    REASONING_PARSERS[name] = parser


def load_plugins() -> None:
    """Register the parsers of the `llmserve.reasoning_parsers` entry points not yet in
    the table (a built-in name is never replaced by a plugin)."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in REASONING_PARSERS:
            register(ep.name, ep.load())


def names() -> list[str]:
    load_plugins()
    return sorted(REASONING_PARSERS)


def get(name: str) -> type[ReasoningParser]:
    """The parser class registered as `name`, looking in the plugins if need be."""
    if name not in REASONING_PARSERS:
        load_plugins()
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise UnknownReasoningParserError(
            f"invalid reasoning parser: {name} (chose from {{ {','.join(names())} }})"
        ) from None


__all__ = [
    "ENTRY_POINT_GROUP",
    "REASONING_PARSERS",
    "DeepSeekR1Parser",
    "GateRule",
    "GraniteParser",
    "HarmonyParser",
    "MarkerStream",
    "MistralParser",
    "Pair",
    "Qwen3Parser",
    "ReasoningParser",
    "ReasoningStream",
    "Split",
    "ThinkTagParser",
    "UnknownReasoningParserError",
    "get",
    "load_plugins",
    "names",
    "register",
]
