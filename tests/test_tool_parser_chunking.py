"""Every tool-call parser, old and new, streams what it reads whole, however the text is
chunked: for each recorded output (tests/test_tool_parsers.CASES, plus the forced
"required" and named outputs), every split of the text into two chunks and 30 random
multi-chunkings (fixed seeds) give the content of the whole reading, the same calls in the
same order, and argument deltas that concatenate to the final arguments (as JSON; as text
too where the parser's whole reading is its scanner's), each prefix on the way a prefix
of valid JSON. Pure Python."""

from __future__ import annotations

import json
import random

import partial_json_parser
import pytest
from server.frontend.chat.tool_parsers import TOOL_PARSERS, get_tool_parser
from server.frontend.chat.tool_parsers._framed import FramedToolParser
from server.frontend.chat.tool_parsers.tool_schema import (
    NamedToolCallParser,
    RequiredToolCallParser,
)
from test_tool_parsers import CASES, _stream

FORCED = {
    "required": [
        '[{"name": "get_weather", "parameters": {"city": "Paris"}}]',
        (' [{"name": "get_time", "parameters": {"zone": "UTC"}}, {"name": "get_weather", '
         '"parameters": {"city": "S\\u00e3o \\"Paulo\\"", "days": [1, 2.5e1]}}] '),
    ],
    "named": ['{"city": "Zürich", "unit": "celsius"}', '\n {"a": [1, {"b": null}]}'],
}
QWEN_TOOLS = [{"type": "function", "function": {"name": "plan", "parameters": {
    "type": "object", "properties": {
        "n": {"type": "integer"}, "ratio": {"type": "number"}, "ok": {"type": "boolean"},
        "tags": {"type": "array"}, "opt": {"type": ["string", "null"]},
        "text": {"type": "string"}}}}}]
QWEN_TYPED = ("<tool_call>\n<function=plan>\n<parameter=n>\n3\n</parameter>\n<parameter=ratio>\n"
              "0.5\n</parameter>\n<parameter=ok>\nTrue\n</parameter>\n<parameter=tags>\n"
              '["a", "b"]\n</parameter>\n<parameter=opt>\nnull\n</parameter>\n<parameter=text>\n'
              "line one\nline <two>\n</parameter>\n</function>\n</tool_call>")


def make_parser(name: str):
    if name == "required":
        return RequiredToolCallParser()
    if name == "named":
        return NamedToolCallParser("get_weather")
    if name == "qwen3_typed":
        return get_tool_parser("qwen3_coder")(QWEN_TOOLS)
    return get_tool_parser(name)()


def _texts() -> list[tuple[str, str]]:
    texts = [(name, text) for name, cases in CASES.items() for text, _, _ in cases]
    texts += [(name, text) for name, items in FORCED.items() for text in items]
    texts.append(("qwen3_typed", QWEN_TYPED))
    return texts


TEXTS = _texts()


def _ids() -> list[str]:
    return [f"{name}-{i}" for i, (name, _) in enumerate(TEXTS)]


def _chunkings(text: str) -> list[list[str]]:
    splits = [[text[:i], text[i:]] for i in range(len(text) + 1)]
    for seed in range(30):
        rng = random.Random(seed)
        count = rng.randint(2, max(2, min(40, len(text))))
        cuts = sorted(rng.sample(range(len(text) + 1), min(count, len(text) + 1)))
        splits.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])])
    return splits


def test_every_registered_parser_has_recorded_outputs():
    formats = {cls for cls in TOOL_PARSERS.values()}
    covered = {type(make_parser(name)) for name in CASES}
    assert formats <= covered


@pytest.mark.parametrize(("name", "text"), TEXTS, ids=_ids())
def test_every_chunking_streams_the_whole_reading(name, text):
    parser = make_parser(name)
    whole = parser.parse(text)
    expected = [(call.name, call.arguments_json) for call in whole.calls]
    as_text = isinstance(parser, FramedToolParser) or name == "named"
    for pieces in _chunkings(text):
        content, calls, prefixes = _stream(parser, [p for p in pieces if p])
        assert content == (whole.content or ""), pieces
        assert [c[1] for c in calls] == [n for n, _ in expected], pieces
        for (_, _, streamed), (_, final) in zip(calls, expected):
            assert json.loads(streamed) == json.loads(final), pieces
            if as_text:
                assert streamed == final, pieces
        for prefix in prefixes:
            if prefix:
                partial_json_parser.loads(prefix)


def test_qwen3_values_typed_by_the_schema():
    (call,) = make_parser("qwen3_typed").parse(QWEN_TYPED).calls
    assert json.loads(call.arguments_json) == {
        "n": 3, "ratio": 0.5, "ok": True, "tags": ["a", "b"], "opt": None,
        "text": "line one\nline <two>"}
