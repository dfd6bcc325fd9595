"""Streaming tool calls reads each part of a choice's text once (server/frontend/chat/tool_parsers):

- per parser, any text (recorded outputs, generated calls, and both mutated: characters,
  tags and escapes inserted, cut or deleted) split at random points streams the same deltas,
  feed by feed, as the former reading that re-scanned the whole text on every delta
  (tests/tool_scan_reference.py, frozen), call ids aside;
- valid outputs split at random points stream the content and calls of the whole text
  parsed at once;
- the Python work a token costs does not grow with the call: feeding the last tokens of
  a call of 1600 array items takes no more steps than those of a call of 100.

Pure Python; the property tests run a few hundred examples per parser."""

from __future__ import annotations

import itertools
import json
import re
import sys

import pytest
import tool_scan_reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server.frontend.chat.tool_parsers import ContentDelta, ToolCallDelta, get_tool_parser
from server.frontend.chat.tool_parsers.base import ToolParser
from server.frontend.chat.tool_parsers.tool_schema import (
    NamedToolCallParser, RequiredToolCallParser,
)
from test_tool_parsers import CASES, MALFORMED, _stream

PARSERS = ["hermes", "llama3_json", "mistral", "pythonic", "required", "required_single",
           "named"]


def make_parser(name: str) -> ToolParser:
    if name == "required":
        return RequiredToolCallParser()
    if name == "required_single":
        return RequiredToolCallParser(parallel_tool_calls=False)
    if name == "named":
        return NamedToolCallParser("get_weather")
    return get_tool_parser(name)()


# Outputs beside the recorded ones in test_tool_parsers, for paths those do not take:
# duplicate keys, a name that is no string before one that is, `parameters` before
# `arguments`, non-call objects in a Mistral list, v11 markers repeated, Python strings
# with every kind of quote, trailing text after a complete list.
EXTRA = {
    "hermes": [
        '<tool_call>{"name": 1, "name": "f", "arguments": {"a": 1}}</tool_call>',
        ('<tool_call>{"name": "f", "arguments": {"a": [1, 2, {"b": "c\\u00e9"}], "k": null}}'
         '</tool_call>  <tool_call>{"name": "g", "arguments": "x"}</tool_call>'),
        '  \n <tool_call>  {"arguments": {"x": [[[[1]]]]}, "name": "f"} </tool_call',
        'hi <tool_call>{"name": "f", "arguments": {"a\\x": 1}}</tool_call>',
    ],
    "llama3_json": [
        ('{"name": "a", "parameters": {"x": 1}, "arguments": {"y": 2}}; '
         '{"name": "b", "parameters": {"z": [1}}'),
        '  <|python_tag|> {"name": "a", "parameters": {}} {"x": 1} {"name": "b", "parameters": {}}',
    ],
    "mistral": [
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"x": 1}, "s", {"name": "g"}]',
        '[TOOL_CALLS] f[ARGS]{"a": 1}[TOOL_CALLS] [TOOL_CALLS]g{"b": [1, {"c": 2}]} [TOOL_CALLS]',
        'x[TOOL_CALLS]{"name": "f", "arguments": "{}"}',
        '[TOOL_CALLS][TOOL_CALLS]  [{"name": "a", "arguments": {}}] tail [TOOL_CALLS]',
    ],
    "pythonic": [
        "[f(a='''x'y''', b=\"q\\\\\"\", c=[1, (2, 3)], d={'k': [None]}), g(), h.i(z=-1.5e3)]",
        "[f(a=1)] trailing",
        "  [f(a='x\\'y', b=''), g(c=\"\"\"z\"\"\")]",
    ],
    "required": [
        ('[{"name": "get_weather", "parameters": {"city": "S\\u00e3o"}}, '
         '{"name": "route", "parameters": {"a": [1, 2]}}]'),
        '[{"name": "a", "parameters": {}}] junk',
        ' [ {"parameters": {"x": 1}, "name": "b"} ]  ',
    ],
    "named": ['{"city": "Zürich", "unit": "celsius"}', '  \n {"a": [1, 2]}', "  "],
}
EXTRA["required_single"] = EXTRA["required"]


def corpus(name: str) -> list[str]:
    base = "required" if name == "required_single" else name
    recorded = [text for text, _, _ in CASES.get(base, [])]
    malformed = [text for parser, text, _ in MALFORMED if parser == base]
    return recorded + malformed + EXTRA[name]


# What a mutation inserts: the characters and tokens the scanners decide on.
PIECES = [*'{}[]",:\\ \n\tabfnrtu0123456789-.eE+\'()=', "<tool_call>", "</tool_call>",
          "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", '"name"', '"arguments"', '"parameters"',
          "true", "null", "NaN", "f(", "\\u00", "\x01", "é", "☀️"]

_TEXT = st.lists(st.sampled_from([*'ab "\\\'{}[](),:=é☀/<>\n\t', "\x01", "[TOOL_CALLS]"]),
                max_size=6).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)
arguments_objects = st.dictionaries(st.sampled_from(["a", "city", "x_1", "query", "_n"]),
                                    json_values, max_size=3)
names = st.sampled_from(["f", "get_weather", "search_tool", "_x1", "weather.lookup"])


def _python(value: object) -> str:
    """A JSON value as a Python literal (the pythonic format's arguments)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_python(k)}: {_python(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_python(v) for v in value) + "]"
    return repr(value)


def render(parser: str, calls: list[tuple[str, dict]], content: str, v11: bool) -> str:
    """Calls written in a parser's format, valid output of that format."""
    dumps = json.dumps
    if parser == "hermes":
        return content + "".join(
            f'<tool_call>\n{{"name": {dumps(n)}, "arguments": {dumps(a)}}}\n</tool_call>\n'
            for n, a in calls)
    if parser == "llama3_json":
        return "; ".join(f'{{"name": {dumps(n)}, "parameters": {dumps(a)}}}' for n, a in calls)
    if parser == "mistral":
        if v11:
            return content + "".join(f"[TOOL_CALLS]{n}[ARGS]{dumps(a)}" for n, a in calls)
        body = ", ".join(f'{{"name": {dumps(n)}, "arguments": {dumps(a)}}}' for n, a in calls)
        return f"{content}[TOOL_CALLS][{body}]"
    if parser == "pythonic":
        return "[" + ", ".join(
            f"{n}({', '.join(f'{k}={_python(v)}' for k, v in a.items())})" for n, a in calls
        ) + "]"
    if parser.startswith("required"):
        return "[" + ", ".join(
            f'{{"name": {dumps(n)}, "parameters": {dumps(a)}}}' for n, a in calls) + "]"
    return dumps(calls[0][1])


@st.composite
def generated(draw: st.DrawFn, parser: str) -> str:
    calls = draw(st.lists(st.tuples(names, arguments_objects), min_size=1, max_size=3))
    content = draw(st.sampled_from(["", "Sure. ", "\n", "Checking: {x} [y] "]))
    if parser in ("llama3_json", "pythonic", "named") or parser.startswith("required"):
        content = ""
    return render(parser, calls, content, draw(st.booleans()))


@st.composite
def mutated(draw: st.DrawFn, text: str) -> str:
    for _ in range(draw(st.integers(0, 3))):
        pos = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["insert", "delete", "cut", "repeat"]))
        if kind == "insert":
            text = text[:pos] + draw(st.sampled_from(PIECES)) + text[pos:]
        elif kind == "delete":
            text = text[:pos] + text[pos + 1 :]
        elif kind == "cut":
            text = text[:pos]
        else:
            start = draw(st.integers(0, len(text)))
            text = text[:pos] + text[start : start + draw(st.integers(1, 20))] + text[pos:]
    return text


@st.composite
def split(draw: st.DrawFn, text: str) -> list[str]:
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(text) - 1)), max_size=60))))
    bounds = [0, *[c for c in cuts if 0 < c < len(text)], len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def _deltas(stream, pieces: list[str]) -> list[list[tuple]]:
    """Each feed's deltas, then finish's; call ids numbered in order of appearance."""
    ids: dict[str, int] = {}
    out = []
    for batch in [*(stream.feed(p) for p in pieces), stream.finish()]:
        row: list[tuple] = []
        for d in batch:
            if isinstance(d, ContentDelta):
                row.append(("content", d.text))
            else:
                assert isinstance(d, ToolCallDelta)
                number = None if d.id is None else ids.setdefault(d.id, len(ids))
                row.append(("call", d.index, number, d.name, d.arguments))
        out.append(row)
    return out


EXAMPLES = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("parser_name", PARSERS)
@EXAMPLES
@given(data=st.data())
def test_stream_agrees_with_the_full_rescan_delta_for_delta(parser_name, data):
    source = data.draw(st.sampled_from(corpus(parser_name)) | generated(parser_name))
    text = data.draw(mutated(source))
    pieces = data.draw(split(text))
    parser = make_parser(parser_name)
    expected = _deltas(tool_scan_reference.ReferenceStream(parser), pieces)
    assert _deltas(parser.new_stream(), pieces) == expected, (text, pieces)


@pytest.mark.parametrize("parser_name", PARSERS)
@EXAMPLES
@given(data=st.data())
def test_random_splits_stream_what_the_whole_text_parses_to(parser_name, data):
    source = st.sampled_from([t for t, _, _ in CASES.get(parser_name, [])])
    text = data.draw(generated(parser_name) | source if parser_name in CASES
                     else generated(parser_name))
    pieces = data.draw(split(text))
    parser = make_parser(parser_name)
    parsed = parser.parse(text)
    content, calls, _ = _stream(parser, pieces)
    assert content == (parsed.content or "")
    assert [(name, json.loads(args)) for _, name, args in calls] == [
        (call.name, json.loads(call.arguments_json)) for call in parsed.calls]


# Word pieces, or up to two punctuation marks, each with the space before it.
TOKEN = re.compile(r"\s?[A-Za-z0-9_]+|\s?[^\sA-Za-z0-9_]{1,2}|\s+")


def _call_tokens(parser_name: str, items: int) -> list[str]:
    """One call whose arguments hold an array of `items` strings, in model-like tokens
    (`""`, `,`, ` ""`)."""
    array = "[" + ", ".join(['""'] * items) + "]"
    text = {
        "hermes": f'<tool_call>\n{{"name": "f", "arguments": {{"a": {array}}}}}\n</tool_call>',
        "llama3_json": f'{{"name": "f", "parameters": {{"a": {array}}}}}',
        "mistral": f'[TOOL_CALLS][{{"name": "f", "arguments": {{"a": {array}}}}}]',
        "pythonic": f"[f(a={array})]",
        "required": f'[{{"name": "f", "parameters": {{"a": {array}}}}}]',
        "named": f'{{"a": {array}}}',
    }[parser_name.replace("_single", "")]
    return TOKEN.findall(text)


def _steps_of_late_tokens(parser_name: str, items: int, count: int = 30) -> int:
    """Python lines run while `count` tokens late in the array are fed (its end, which
    decodes the whole call once, is not among them)."""
    tokens = _call_tokens(parser_name, items)[:-10]
    stream = make_parser(parser_name).new_stream()
    stream.feed("".join(tokens[:-count]))
    steps = 0

    def tracer(frame, event, arg):
        nonlocal steps
        if event == "line":
            steps += 1
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        for token in tokens[-count:]:
            stream.feed(token)
    finally:
        sys.settrace(previous)
    return steps


@pytest.mark.parametrize("parser_name", PARSERS)
def test_feed_work_stays_flat_as_a_call_grows(parser_name):
    small = _steps_of_late_tokens(parser_name, 100)
    large = _steps_of_late_tokens(parser_name, 1600)
    assert large <= small * 1.25 + 50, (small, large)
