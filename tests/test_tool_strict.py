"""Strict tool calls under tool_choice "auto" (server/frontend/chat/tool_parsers/strict.py):
which requests get a structural tag at each --tool-strict-level, what it holds per tool,
parallel_tool_calls=false, the parsers that ignore `strict`, a request's own structured
output winning; and the tag compiled by the real guidance backend over the default model's
tokenizer, fed model-like text token by token."""

from __future__ import annotations

import json
from typing import Any

import pytest
from actors.params.sampling import SamplingParams
from actors.params.structured import StructuredSpec
from server.api.common.chat_body import to_chat
from server.api.common.chat_protocol import ChatCompletionRequest
from server.api.common.messages_body import chat_request
from server.api.common.messages_protocol import AnthropicMessagesRequest
from server.config import ServerConfig
from server.frontend.chat.tool_parsers import get_tool_parser
from server.frontend.chat.tool_parsers.strict import strict_tool_tag
from server.frontend.chat.tools import apply_plan, plan_tools
from structured_helpers import backend, tok

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
           "required": ["city"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}


def tools(strict_weather: bool | None = True) -> list[dict[str, Any]]:
    weather: dict[str, Any] = {"name": "get_weather", "parameters": WEATHER}
    if strict_weather is not None:
        weather["strict"] = strict_weather
    return [{"type": "function", "function": weather},
            {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]


def schemas(tag: dict[str, Any]) -> dict[str, Any]:
    """Each tag's begin → its schema."""
    return {t["begin"]: t["content"]["json_schema"] for t in tag["format"]["tags"]}


__all__ = ["backend", "tok"]  # fixtures

HERMES = get_tool_parser("hermes")


def test_auto_level_tags_only_requests_with_a_strict_tool():
    assert strict_tool_tag(HERMES, tools(None), None, True) is None
    assert strict_tool_tag(HERMES, tools(False), "auto", None) is None
    tag = strict_tool_tag(HERMES, tools(True), None, True)
    assert tag is not None and tag["format"]["triggers"] == ["<tool_call>"]
    assert tag["format"]["stop_after_first"] is False
    by_begin = schemas(tag)
    assert by_begin['<tool_call>\n{"name": "get_weather", "arguments": '] == WEATHER
    assert by_begin['<tool_call>{"name": "get_weather", "arguments": '] == WEATHER
    # A tool that is not strict is held to its name only.
    assert by_begin['<tool_call>\n{"name": "get_time", "arguments": '] is True


def test_function_and_parameter_levels_set_a_floor():
    tag = strict_tool_tag(HERMES, tools(None), "function", True)
    assert tag is not None and set(map(json.dumps, schemas(tag).values())) == {"true"}
    tag = strict_tool_tag(HERMES, tools(None), "parameter", True)
    assert tag is not None
    assert sorted(map(json.dumps, schemas(tag).values())) == sorted(
        [json.dumps(WEATHER)] * 2 + [json.dumps(TIME)] * 2)


def test_parallel_false_stops_after_the_first_call_at_least_at_function_level():
    tag = strict_tool_tag(HERMES, tools(None), None, False)
    assert tag is not None and tag["format"]["stop_after_first"] is True
    assert set(map(json.dumps, schemas(tag).values())) == {"true"}


@pytest.mark.parametrize("name", ["deepseek_v3", "deepseek_v31", "llama3_json"])
def test_json_marker_parsers_get_a_tag(name):
    tag = strict_tool_tag(get_tool_parser(name), tools(True), None, True)
    assert tag is not None and WEATHER in schemas(tag).values()


@pytest.mark.parametrize("name", ["mistral", "pythonic", "granite", "qwen3_coder", "openai"])
def test_parsers_without_a_json_call_marker_ignore_strict(name):
    assert strict_tool_tag(get_tool_parser(name), tools(True), "parameter", False) is None


def plan_params(config: ServerConfig, **body: Any) -> SamplingParams:
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "tools": tools(True), **body})
    params = SamplingParams()
    if "structured_outputs" in body:
        params = SamplingParams(structured=StructuredSpec.from_params(
            **body["structured_outputs"]))
    return apply_plan(params, plan_tools(to_chat(req), config))


CONFIG = ServerConfig(enable_auto_tool_choice=True, tool_call_parser="hermes")


def test_the_plan_puts_the_tag_on_auto_requests_only():
    spec = plan_params(CONFIG).structured
    assert spec is not None and spec.kind == "structural_tag"
    assert WEATHER in schemas(spec.structural_tag()).values()
    # "required" keeps its JSON array; the request's own constraint wins over the tag.
    assert plan_params(CONFIG, tool_choice="required").structured.kind == "json"
    own = plan_params(CONFIG, structured_outputs={"regex": "[a-z]+"}).structured
    assert own.kind == "regex"
    assert plan_params(ServerConfig(enable_auto_tool_choice=True, tool_call_parser="pythonic")
                       ).structured is None


def accepts(backend: Any, tok: Any, spec: StructuredSpec, text: str) -> bool:
    m = backend.compile(spec)
    ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    return all(m.accept(t) for t in ids)


def call(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def test_the_tag_holds_strict_arguments_and_leaves_text_free(tok, backend):
    spec = plan_params(CONFIG).structured
    assert accepts(backend, tok, spec, "Let me check. " + call("get_weather", {"city": "Rome"}))
    assert accepts(backend, tok, spec, "Just prose, no call.")
    assert not accepts(backend, tok, spec, call("get_weather", {"city": "Berlin"}))
    assert not accepts(backend, tok, spec, call("get_nothing", {}))
    # get_time is not strict: its arguments are any JSON object.
    assert accepts(backend, tok, spec, call("get_time", {"when": [1, 2]}))
    two = call("get_weather", {"city": "Rome"}) + call("get_time", {"zone": "UTC"})
    assert accepts(backend, tok, spec, two)
    single = plan_params(CONFIG, parallel_tool_calls=False).structured
    assert accepts(backend, tok, single, call("get_weather", {"city": "Rome"}))
    assert not accepts(backend, tok, single, two)



@pytest.mark.parametrize("strict", [True, None])
def test_an_anthropic_tools_strict_reaches_the_plan(strict):
    tool = {"name": "get_weather", "input_schema": WEATHER}
    if strict is not None:
        tool["strict"] = strict
    req = AnthropicMessagesRequest.model_validate({
        "model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
        "tools": [tool]})
    config = ServerConfig(enable_auto_tool_choice=True, tool_call_parser="hermes")
    plan = plan_tools(to_chat(chat_request(req)), config)
    assert (plan.strict_tag is not None) is bool(strict)
