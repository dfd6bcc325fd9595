"""Tool-call parsers (server/frontend/chat/tool_parsers): recorded model-like outputs per
format, read whole and streamed in random splits, which must agree; malformed output must
come back as content and never raise. Pure Python and fast."""

from __future__ import annotations

import json
import random
import re

import partial_json_parser
import pytest
from server.frontend.chat.tool_parsers import (
    TOOL_PARSERS,
    ContentDelta,
    ToolCallDelta,
    UnknownToolParserError,
    check_tool_parser_flags,
    get_tool_parser,
)
from tool_parser_cases import FORMAT_CASES

OPENAI_ID = re.compile(r"chatcmpl-tool-[0-9a-f]{16}")
MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")
SEEDS = range(6)

# (text, content, [(name, arguments)]) per parser: zero, one and several calls, content
# around them, escapes and non-ASCII text inside strings.
CASES = {
    "hermes": [
        ("The capital of France is Paris.", "The capital of France is Paris.", []),
        (
            (
                'Let me check the weather.\n<tool_call>\n{"name": "get_current_weather", '
                '"arguments": {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}}\n'
                "</tool_call>"
            ),
            "Let me check the weather.\n",
            [("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})],
        ),
        (
            (
                '\n<tool_call>{"name": "write", "arguments": {"path": "C:\\\\tmp\\\\a.txt", '
                '"text": "He said \\"hi\\" </tool_call> caf\\u00e9 ☀️", "n": [1, -2.5e3, true, '
                'null], "o": {"k": {}}}}</tool_call>\n<tool_call>\n{"name": "ping", "arguments": '
                "{}}\n</tool_call>\nignored trailing text"
            ),
            None,
            [
                (
                    "write",
                    {
                        "path": "C:\\tmp\\a.txt",
                        "text": 'He said "hi" </tool_call> café ☀️',
                        "n": [1, -2500.0, True, None],
                        "o": {"k": {}},
                    },
                ),
                ("ping", {}),
            ],
        ),
        # The end token stopped generation before the closing tag.
        (
            '<tool_call>{"arguments": {"q": "x"}, "name": "search"}',
            None,
            [("search", {"q": "x"})],
        ),
    ],
    "llama3_json": [
        ("Hello! How can I help?", "Hello! How can I help?", []),
        (
            '{"name": "searchTool", "parameters": {"query": "test {value} [complex]"}}',
            None,
            [("searchTool", {"query": "test {value} [complex]"})],
        ),
        (
            (
                '<|python_tag|>{"name": "searchTool", "arguments": {"query": "Zürich \\"old\\""}}; '
                '{"name": "getOpenIncidentsTool", "parameters": {}}; {"name": "complexTool", '
                '"parameters": {"level1": {"level2": {"value": "deep", "list": [[1], {"a": 2}]}}}}'
                " Would you like more?"
            ),
            None,
            [
                ("searchTool", {"query": 'Zürich "old"'}),
                ("getOpenIncidentsTool", {}),
                ("complexTool", {"level1": {"level2": {"value": "deep", "list": [[1], {"a": 2}]}}}),
            ],
        ),
        (
            'Here it is: {"name": "searchTool", "parameters": {}}',
            'Here it is: {"name": "searchTool", "parameters": {}}',
            [],
        ),
    ],
    "mistral": [
        ("No tool is needed here.", "No tool is needed here.", []),
        (
            (
                'Checking both. [TOOL_CALLS] [{"name": "add", "arguments": {"a": 3.5, "b": 4}}, '
                '{"name": "get_weather", "arguments": {"city": "San Francisco", "unit": "celsius"}}]'
            ),
            "Checking both. ",
            [
                ("add", {"a": 3.5, "b": 4}),
                ("get_weather", {"city": "San Francisco", "unit": "celsius"}),
            ],
        ),
        (
            (
                '\n[TOOL_CALLS][{"name": "f", "arguments": "{\\"x\\": \\"\\u00fc\\"}"}, 7, '
                '{"name": "now"}] trailing'
            ),
            None,
            [("f", {"x": "ü"}), ("now", {})],
        ),
        (
            (
                '[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich", "note": "a \\"b\\" [TOOL_CALLS]"}'
                '[TOOL_CALLS]add{"a": 1, "b": [2, 3]}'
            ),
            None,
            [
                ("get_weather", {"city": "Zürich", "note": 'a "b" [TOOL_CALLS]'}),
                ("add", {"a": 1, "b": [2, 3]}),
            ],
        ),
    ],
    "pythonic": [
        ("How can I help you today?", "How can I help you today?", []),
        (
            '[get_weather(city="San Francisco", metric="celsius")]',
            None,
            [("get_weather", {"city": "San Francisco", "metric": "celsius"})],
        ),
        (
            (
                "[register_user(name='John Doe', age=37, address={'city': 'San Francisco', "
                "'state': 'CA'}, role=None, passed_test=True, aliases=['John', 'Johnny'], "
                "size=(800, 600), t=-1.5), get_time(), do_something_cool(additional_data={}, "
                "steps=[], flag=true, nothing=null,)]"
            ),
            None,
            [
                (
                    "register_user",
                    {
                        "name": "John Doe",
                        "age": 37,
                        "address": {"city": "San Francisco", "state": "CA"},
                        "role": None,
                        "passed_test": True,
                        "aliases": ["John", "Johnny"],
                        "size": [800, 600],
                        "t": -1.5,
                    },
                ),
                ("get_time", {}),
                (
                    "do_something_cool",
                    {"additional_data": {}, "steps": [], "flag": True, "nothing": None},
                ),
            ],
        ),
        (
            (
                '\n[weather.lookup(city=\'Martha\\\'s Vineyard\', note="a ] b ) c, \\"d\\"", '
                "emoji='☀️ é', doc='''x\ny''')]\nDone."
            ),
            None,
            [
                (
                    "weather.lookup",
                    {
                        "city": "Martha's Vineyard",
                        "note": 'a ] b ) c, "d"',
                        "emoji": "☀️ é",
                        "doc": "x\ny",
                    },
                )
            ],
        ),
    ],
}
CASES.update(FORMAT_CASES)

# Output that is not the format: (parser, text, whether a stream can tell before it
# announces a call). Whole, each is content; streamed, each never raises.
MALFORMED = [
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": 1}', False),
    ("hermes", "Sure.<tool_call>not json</tool_call>", True),
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>', True),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": 1}} junk</tool_call>', False),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"a": NaN}}</tool_call>', False),
    ("hermes", '<tool_call>{"name": 3, "arguments": {}}</tool_call>', True),
    ("hermes", "Almost a tag <tool_", True),
    ("llama3_json", '{"name": "invalidTool", "parameters": {invalid json}', False),
    ("llama3_json", '{"parameters": {}}', True),
    ("llama3_json", '{"name": "toolWithoutParams"}', True),
    ("llama3_json", '{"answer": 42}', True),
    ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {x}}]', False),
    ("mistral", "[TOOL_CALLS]Sorry, I cannot.", True),
    ("mistral", "[TOOL_CALLS][1, 2]", True),
    ("mistral", "Text [TOOL_", True),
    ("pythonic", '[get_weather("Paris")]', True),
    ("pythonic", "[f(x=g(1))]", False),
    ("pythonic", "[f(x=1)", False),
    ("pythonic", "[Note] this is prose", True),
    ("pythonic", "[f(x=__import__('os').system('true'))]", False),
    ("pythonic", "[f(a=1, a=2)]", False),
    ("pythonic", "[f(x=1e999)]", False),
    ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\n1", False),
    ("qwen3_coder", "Text <tool_call>\nnot a function</tool_call>", True),
    ("deepseek_v3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{x}", False),
    ("deepseek_v31", "<｜tool▁calls▁begin｜>nothing here", True),
    ("granite", "<|tool_call|>not json", True),
    ("granite", '<tool_call>[{"name": "f", "arguments": {"a": 1', False),
]


def _pieces(text: str, seed: int | None) -> list[str]:
    if seed is None:
        return list(text)
    rng = random.Random(seed)
    pieces, pos = [], 0
    while pos < len(text):
        size = rng.randint(1, 7)
        pieces.append(text[pos : pos + size])
        pos += size
    return pieces


def _stream(parser, pieces: list[str]):
    """Feed the pieces; return the content, the calls as (id, name, arguments) and every
    arguments prefix sent along the way."""
    stream = parser.new_stream()
    deltas = []
    for piece in pieces:
        deltas += stream.feed(piece)
    deltas += stream.finish()
    content, calls, prefixes = "", [], []
    for delta in deltas:
        if isinstance(delta, ContentDelta):
            assert delta.text
            content += delta.text
            continue
        assert isinstance(delta, ToolCallDelta)
        if delta.id is not None:
            assert delta.index == len(calls) and delta.name
            assert delta.to_openai()["type"] == "function"
            calls.append([delta.id, delta.name, delta.arguments])
        else:
            assert delta.index < len(calls) and delta.name is None and delta.arguments
            assert set(delta.to_openai()) == {"index", "function"}
            calls[delta.index][2] += delta.arguments
        prefixes.append(calls[delta.index][2])
    return content, calls, prefixes


def _assert_json_prefixes(prefixes: list[str]) -> None:
    """Every arguments text a client has held was a JSON prefix (checked with a parser
    independent of the scanner under test)."""
    for prefix in prefixes:
        if prefix:
            partial_json_parser.loads(prefix)


def _case_ids():
    return [(name, i) for name, cases in CASES.items() for i in range(len(cases))]


@pytest.mark.parametrize("parser_name,case", _case_ids())
def test_parse(parser_name, case):
    text, content, expected = CASES[parser_name][case]
    parser = get_tool_parser(parser_name)()
    result = parser.parse(text)
    assert result.content == content
    assert [(c.name, json.loads(c.arguments_json)) for c in result.calls] == expected
    id_shape = MISTRAL_ID if parser_name == "mistral" else OPENAI_ID
    assert all(id_shape.fullmatch(c.id) for c in result.calls)
    assert len({c.id for c in result.calls}) == len(result.calls)
    assert result.tools_called == bool(expected)


@pytest.mark.parametrize("parser_name,case", _case_ids())
@pytest.mark.parametrize("seed", [None, *SEEDS, "whole"])
def test_stream_matches_parse(parser_name, case, seed):
    text, content, expected = CASES[parser_name][case]
    parser = get_tool_parser(parser_name)()
    pieces = [text] if seed == "whole" else _pieces(text, seed)
    streamed_content, calls, prefixes = _stream(parser, pieces)
    assert streamed_content == (content or "")
    assert [(name, json.loads(args)) for _, name, args in calls] == expected
    id_shape = MISTRAL_ID if parser_name == "mistral" else OPENAI_ID
    assert all(id_shape.fullmatch(call_id) for call_id, _, _ in calls)
    _assert_json_prefixes(prefixes)


@pytest.mark.parametrize("parser_name,text,early", MALFORMED)
def test_malformed_is_content(parser_name, text, early):
    parser = get_tool_parser(parser_name)()
    result = parser.parse(text)
    assert result.calls == []
    assert result.content == text.replace("[TOOL_CALLS]", "") if parser_name == "mistral" else text
    for seed in [None, *SEEDS]:
        content, calls, prefixes = _stream(parser, _pieces(text, seed))
        _assert_json_prefixes(prefixes)
        if early:
            assert (content, calls) == (result.content, [])


def test_stream_holds_tag_prefixes_back():
    stream = get_tool_parser("hermes")().new_stream()
    sent = [d.text for piece in ["Hi <", "tool", "_ca"] for d in stream.feed(piece)]
    assert sent == ["Hi "]
    deltas = stream.feed('ll>{"name": "f", "arguments": {"a": "b')
    assert [(d.index, d.name, d.arguments) for d in deltas] == [(0, "f", '{"a": "b')]
    assert stream.feed('"}}</tool_call>')[0].arguments == '"}'
    assert stream.finish() == []


def test_pythonic_streams_each_argument_once_complete():
    stream = get_tool_parser("pythonic")().new_stream()
    assert stream.feed("[f(") == []  # f("Paris") would not be a call
    assert [(d.name, d.arguments) for d in stream.feed("a='x")] == [("f", "{")]
    assert [d.arguments for d in stream.feed("y', b=[1")] == ['"a": "xy"']
    rest = stream.feed(", 2])]") + stream.finish()
    assert "".join(d.arguments for d in rest) == ', "b": [1, 2]}'


def test_long_arguments_stream_fast():
    import time

    code = json.dumps('def f(x):\n    return x * 2  # "q" é\n' * 200)
    text = '<tool_call>{"name": "run", "arguments": {"code": ' + code + "}}</tool_call>"
    started = time.perf_counter()
    _, calls, _ = _stream(
        get_tool_parser("hermes")(), [text[i : i + 4] for i in range(0, len(text), 4)]
    )
    assert json.loads(calls[0][2])["code"] == json.loads(code)
    assert time.perf_counter() - started < 5.0


def test_registry_names_and_unknown_name():
    assert sorted(TOOL_PARSERS) == [
        "deepseek_v3", "deepseek_v31", "gpt_oss", "granite", "hermes", "llama3_json",
        "llama4_json", "mistral", "openai", "pythonic", "qwen3_coder", "qwen3_json", "qwen3_xml"]
    with pytest.raises(
        UnknownToolParserError, match=r"invalid tool call parser: nope \(chose from \{ deepseek_v3,"
    ):
        get_tool_parser("nope")
    with pytest.raises(UnknownToolParserError, match="requires --tool-call-parser"):
        check_tool_parser_flags(True, None)
    check_tool_parser_flags(True, "hermes")
    check_tool_parser_flags(False, None)


def test_stream_after_finish_refuses_more_text():
    stream = get_tool_parser("hermes")().new_stream()
    assert stream.finish() == []
    with pytest.raises(RuntimeError):
        stream.feed("x")


def test_call_arguments_too_deep_to_decode_are_no_json():
    """A named call cut by max_tokens inside 100 000 `[` is no call (the decoder's depth
    limit ends it, not a 500); Anthropic's `input` of such arguments is {}."""
    from server.api.anthropic.render import _input
    from server.frontend.chat.tool_calls import ToolCallChoice
    from server.frontend.chat.tool_parsers.tool_schema import NamedToolCallParser
    from server.frontend.chat.tools import ToolPlan

    deep = "[" * 100_000
    plan = ToolPlan("named", [], NamedToolCallParser("f"), schema={})
    message, reason = ToolCallChoice(plan).message("assistant", "", deep, "length")
    assert reason == "length" and "tool_calls" not in message
    assert _input(deep) == {}
