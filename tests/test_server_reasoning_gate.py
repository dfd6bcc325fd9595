"""Structured outputs and `thinking_token_budget` under `--reasoning-parser deepseek_r1`,
through `python -m server` and the real openai SDK, with the real model.

The default model does not think, and DeepSeek-R1's parser reads its output as reasoning
from the first token. A constraint therefore binds only after the reasoning, which the model
never closes by itself: the budget closes it, by forcing `</think>` after that many
tokens, and the content that follows must parse against the schema (or be a valid forced
tool call), whole and streamed alike, on chat, completions and Responses. A budget without
a reasoning parser, or out of range, is a 400 naming the field.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from server_helpers import ServerProcess

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "Pick a colour and answer as JSON."}]
SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
          "required": ["colour"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "pick", "schema": SCHEMA}}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                   "required": ["city"], "additionalProperties": False}}}]


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--reasoning-parser", "deepseek_r1", "--tool-call-parser", "hermes",
                        "--enable-auto-tool-choice").wait_ready()
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
        yield c


def extra(obj, name: str):
    value = getattr(obj, name, None)
    return value if value is not None else (obj.model_extra or {}).get(name)


def chat(client, budget, body=None, **kw):
    kw.setdefault("messages", ASK)
    kw.setdefault("max_tokens", 80)
    return client.chat.completions.create(
        model=MODEL, temperature=0,
        extra_body={"thinking_token_budget": budget, **(body or {})}, **kw)


def streamed(client, budget, **kw):
    out = {"reasoning": "", "content": "", "tool_calls": {}}
    usage = None
    for chunk in chat(client, budget, stream=True, stream_options={"include_usage": True},
                      **kw):
        usage = chunk.usage or usage
        for c in chunk.choices:
            out["reasoning"] += extra(c.delta, "reasoning") or ""
            out["content"] += c.delta.content or ""
            for call in c.delta.tool_calls or []:
                args = out["tool_calls"].setdefault(call.index, "")
                out["tool_calls"][call.index] = args + (call.function.arguments or "")
    return out, usage


@pytest.mark.parametrize("budget", [5, 12])
def test_budget_bounds_the_reasoning_and_the_schema_binds_the_content(client, budget):
    r = chat(client, budget, response_format=FORMAT)
    message = r.choices[0].message
    assert json.loads(message.content)["colour"] in ("red", "green", "blue")
    assert extra(message, "reasoning") and "</think>" not in extra(message, "reasoning")
    details = r.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens <= budget
    assert r.choices[0].finish_reason == "stop"
    out, usage = streamed(client, budget, response_format=FORMAT)
    assert (out["reasoning"], out["content"]) == (extra(message, "reasoning"), message.content)
    assert usage.completion_tokens == r.usage.completion_tokens


def test_budget_zero_ends_the_reasoning_at_once(client):
    r = chat(client, 0, {"structured_outputs": {"json": SCHEMA}})
    message = r.choices[0].message
    assert not extra(message, "reasoning")
    assert json.loads(message.content)["colour"] in ("red", "green", "blue")


@pytest.mark.parametrize("choice", ["required",
                                    {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_call_comes_after_the_reasoning(client, choice):
    kw = {"tools": TOOLS, "tool_choice": choice, "parallel_tool_calls": False,
          "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    r = chat(client, 6, **kw)
    message = r.choices[0].message
    assert extra(message, "reasoning") and not message.content
    (call,) = message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
    out, _ = streamed(client, 6, **kw)
    assert out["reasoning"] == extra(message, "reasoning")
    assert json.loads(out["tool_calls"][0]) == json.loads(call.function.arguments)


def test_completions_and_responses_gate_alike(client):
    prompt = "Question: pick a colour, as JSON.\nAnswer:"
    r = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=60,
                                  extra_body={"thinking_token_budget": 4,
                                              "response_format": FORMAT})
    reasoning, marker, content = r.choices[0].text.partition("</think>")
    assert marker and json.loads(content)["colour"] in ("red", "green", "blue")
    r = client.responses.create(
        model=MODEL, input="Pick a colour and answer as JSON.", temperature=0,
        max_output_tokens=60, extra_body={"thinking_token_budget": 4},
        text={"format": {"type": "json_schema", "name": "pick", "schema": SCHEMA}})
    assert json.loads(r.output_text.split("</think>")[-1])["colour"] in ("red", "green",
                                                                          "blue")


@pytest.mark.parametrize("budget", [-2, 1.5, "lots"])  # "8" and true coerce, as in vLLM
def test_a_budget_out_of_range_is_a_400(server, budget):
    r = httpx.post(server.url + "/v1/chat/completions", json={
        "model": MODEL, "messages": ASK, "thinking_token_budget": budget})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "thinking_token_budget"


def test_minus_one_is_no_budget(client):
    r = chat(client, -1, max_tokens=6)
    assert r.choices[0].message.content is None  # never closed: all reasoning


def test_a_budget_without_a_reasoning_parser_is_a_400(plain_server):
    r = httpx.post(plain_server.url + "/v1/chat/completions", json={
        "model": MODEL, "messages": ASK, "thinking_token_budget": 8})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "thinking_token_budget"
    assert "--reasoning-parser" in error["message"]
