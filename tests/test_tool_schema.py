"""Forced tool choice (server/frontend/chat/tool_parsers/tool_schema): the schema built for
"required" and for a named function accepts valid call output and rejects wrong names and
missing arguments; the constrained output reads back into the same calls whole and
streamed."""

from __future__ import annotations

import copy
import json
import random

import jsonschema
import pytest
from server.frontend.chat.tool_parsers import ContentDelta, ToolCallDelta
from server.frontend.chat.tool_parsers.tool_schema import (
    NamedToolCallParser,
    RequiredToolCallParser,
    ToolChoiceError,
    forced_tool_parser,
    tool_choice_schema,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "route",
            "parameters": {
                "type": "object",
                "$defs": {
                    "Place": {
                        "type": "object",
                        "required": ["lat", "lon"],
                        "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                    }
                },
                "properties": {"from": {"$ref": "#/$defs/Place"}, "to": {"$ref": "#/$defs/Place"}},
                "required": ["from", "to"],
            },
        },
    },
    {"type": "function", "function": {"name": "now"}},
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
PLACE = {"lat": 48.85, "lon": 2.35}


def _valid(schema, value) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def test_auto_and_none_do_not_constrain():
    for choice in ("auto", "none", None):
        assert tool_choice_schema(TOOLS, choice) is None
    assert forced_tool_parser("auto") is None


def test_required_schema_accepts_calls_and_rejects_wrong_ones():
    tools = copy.deepcopy(TOOLS)
    schema = tool_choice_schema(tools, "required")
    assert tools == TOOLS  # $defs are moved in a copy
    assert schema["minItems"] == 1 and "maxItems" not in schema
    assert set(schema["$defs"]) == {"Place"}
    good = [
        {"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}},
        {"name": "route", "parameters": {"from": PLACE, "to": PLACE}},
        {"name": "now", "parameters": {}},
    ]
    assert _valid(schema, good)
    assert not _valid(schema, [])
    assert not _valid(schema, [{"name": "get_wether", "parameters": {"city": "Paris"}}])
    assert not _valid(schema, [{"name": "get_weather", "parameters": {}}])
    assert not _valid(schema, [{"name": "get_weather"}])
    assert not _valid(schema, [{"name": "get_weather", "parameters": {"city": "P", "unit": "K"}}])
    assert not _valid(schema, [{"name": "route", "parameters": {"from": PLACE, "to": {"lat": 1}}}])


def test_parallel_tool_calls_false_allows_one_call():
    schema = tool_choice_schema(TOOLS, "required", parallel_tool_calls=False)
    one = [{"name": "now", "parameters": {}}]
    assert _valid(schema, one) and not _valid(schema, one * 2)
    assert "maxItems" not in tool_choice_schema(TOOLS, "required", parallel_tool_calls=None)


def test_named_schema_is_the_function_parameters():
    schema = tool_choice_schema(TOOLS, NAMED)
    assert _valid(schema, {"city": "Paris"})
    assert not _valid(schema, {"unit": "celsius"})
    assert tool_choice_schema(TOOLS, {"type": "function", "function": {"name": "now"}}) == {
        "type": "object",
        "properties": {},
    }
    with pytest.raises(ToolChoiceError, match="Tool 'nope' has not been passed in `tools`."):
        tool_choice_schema(TOOLS, {"type": "function", "function": {"name": "nope"}})


def test_conflicting_defs_are_refused():
    other = copy.deepcopy(TOOLS[1])
    other["function"]["name"] = "route2"
    other["function"]["parameters"]["$defs"]["Place"] = {"type": "string"}
    with pytest.raises(ToolChoiceError, match="multiple schemas"):
        tool_choice_schema([TOOLS[1], other], "required")


def _stream(parser, text, seed):
    rng = random.Random(seed)
    stream = parser.new_stream()
    deltas, pos = [], 0
    while pos < len(text):
        size = rng.randint(1, 6)
        deltas += stream.feed(text[pos : pos + size])
        pos += size
    deltas += stream.finish()
    assert not [d for d in deltas if isinstance(d, ContentDelta)]
    calls: list[list[str]] = []
    for delta in deltas:
        assert isinstance(delta, ToolCallDelta)
        if delta.id is not None:
            calls.append([delta.name, delta.arguments])
        else:
            calls[delta.index][1] += delta.arguments
    return [(name, json.loads(args)) for name, args in calls]


REQUIRED_OUTPUT = (
    '[{"name": "get_weather", "parameters": {"city": "S\\u00e3o Paulo \\"SP\\""}},\n'
    ' {"name": "route", "parameters": {"from": {"lat": 48.85, "lon": 2.35}, "to": '
    '{"lat": -33.9, "lon": 18.4}}}]'
)


@pytest.mark.parametrize("seed", range(5))
def test_required_output_reads_back(seed):
    schema = tool_choice_schema(TOOLS, "required")
    assert _valid(schema, json.loads(REQUIRED_OUTPUT))
    parser = RequiredToolCallParser()
    result = parser.parse(REQUIRED_OUTPUT)
    expected = [(item["name"], item["parameters"]) for item in json.loads(REQUIRED_OUTPUT)]
    assert result.content is None
    assert [(c.name, json.loads(c.arguments_json)) for c in result.calls] == expected
    assert _stream(parser, REQUIRED_OUTPUT, seed) == expected
    single = RequiredToolCallParser(parallel_tool_calls=False)
    assert [c.name for c in single.parse(REQUIRED_OUTPUT).calls] == ["get_weather"]
    assert _stream(single, REQUIRED_OUTPUT, seed) == expected[:1]


@pytest.mark.parametrize(
    "text", ["", "[", "not json", '[{"name": "f"}]', '{"name": "f", "parameters": {}}']
)
def test_required_output_that_is_no_array_has_no_calls(text):
    result = RequiredToolCallParser().parse(text)
    assert (result.content, result.calls) == (None, [])


@pytest.mark.parametrize("seed", range(3))
def test_named_output_is_the_arguments(seed):
    parser = forced_tool_parser(NAMED)
    assert isinstance(parser, NamedToolCallParser)
    text = '{"city": "Zürich", "unit": "celsius"}'
    result = parser.parse(text)
    assert [(c.name, c.arguments_json) for c in result.calls] == [("get_weather", text)]
    assert _stream(parser, text, seed) == [("get_weather", json.loads(text))]
    assert parser.parse("  ").calls == []
