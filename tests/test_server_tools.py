"""Tool calling on /v1/chat/completions against the real server and the real OpenAI SDK:
named and required tool choice (constrained decoding) streamed and whole, arguments valid
against the tool's schema, an auto (Hermes) call forced by a regex streamed as it parses,
parallel_tool_calls=false, a max_tokens cut, history with tool results through the
bundled tool template, vLLM's 400s naming the field, then a canary;
LangChain's bind_tools and with_structured_output when langchain-openai is installed."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from server_helpers import ROOT, ServerProcess, default_tokenizer

TEMPLATE = str(ROOT / "examples" / "tool_chat_template_chatml_hermes.jinja")
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
           "required": ["city"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description":
                                           "Current weather in a city", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                         "--chat-template", TEMPLATE).wait_ready()
    yield proc.url
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0) as c:
        yield c


def create(client, **kw):
    kw.setdefault("messages", ASK)
    kw.setdefault("max_tokens", 80)
    return client.chat.completions.create(model="SmolLM2-135M-Instruct", tools=TOOLS,
                                          temperature=0, **kw)


def streamed(client, **kw) -> tuple[dict[int, dict], str | None, str]:
    calls: dict[int, dict] = {}
    reason, content = None, ""
    for chunk in create(client, stream=True, **kw):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for tc in choice.delta.tool_calls or []:
            if tc.id is not None:
                assert tc.index not in calls and tc.type == "function" and tc.function.name
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
            else:
                assert tc.function.name is None
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        reason = choice.finish_reason or reason
    return calls, reason, content


def check_call(name: str, arguments: str, call_id: str) -> None:
    assert call_id.startswith("chatcmpl-tool-")
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def test_named_tool_whole_and_streamed(client):
    r = create(client, tool_choice=NAMED)
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content == ""
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    check_call(call.function.name, call.function.arguments, call.id)
    calls, reason, content = streamed(client, tool_choice=NAMED)
    assert reason == "stop" and content == "" and list(calls) == [0]
    assert calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == json.loads(call.function.arguments)
    check_call("get_weather", calls[0]["arguments"], calls[0]["id"])


def test_required_single_call_whole_and_streamed(client):
    choice = create(client, tool_choice="required", parallel_tool_calls=False).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    check_call(call.function.name, call.function.arguments, call.id)
    calls, reason, content = streamed(client, tool_choice="required", parallel_tool_calls=False)
    assert reason == "tool_calls" and content == "" and len(calls) == 1
    assert calls[0]["name"] == call.function.name
    assert json.loads(calls[0]["arguments"]) == json.loads(call.function.arguments)


def test_required_parallel_calls(client):
    # The small model goes on calling until max_tokens: the calls it completed come back
    # valid with finish_reason length, streamed and whole; the call the limit cut is dropped
    # from the whole response (streamed, its fragments had gone out already).
    calls, reason, _ = streamed(client, tool_choice="required", max_tokens=120)
    assert reason == "length" and len(calls) >= 2
    complete = list(calls.values())[:-1]
    for call in complete:
        check_call(call["name"], call["arguments"], call["id"])
    choice = create(client, tool_choice="required", max_tokens=120).choices[0]
    assert choice.finish_reason == "length" and choice.message.content == ""
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in choice.message.tool_calls] == [
        (c["name"], json.loads(c["arguments"])) for c in complete]
    for call in choice.message.tool_calls:
        check_call(call.function.name, call.function.arguments, call.id)


def test_cut_by_max_tokens_is_length_without_half_call(client):
    for choice_kind in (NAMED, "required"):
        choice = create(client, tool_choice=choice_kind, max_tokens=3).choices[0]
        assert choice.finish_reason == "length" and not choice.message.tool_calls


def test_auto_tool_call_streams_as_it_parses(client):
    # structured_outputs.regex makes the model write one Hermes call whose arguments hold
    # an array: streamed token by token, its deltas add up to the call parsed whole.
    regex = (r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "Paris", '
             r'"tags": \[("[a-z]{1,3}", ){40}"x"\]\}\}\n</tool_call>')
    kw = {"tool_choice": "auto", "max_tokens": 400,
          "extra_body": {"structured_outputs": {"regex": regex}}}
    whole = create(client, **kw).choices[0]
    assert whole.finish_reason == "tool_calls" and not whole.message.content, whole
    (call,) = whole.message.tool_calls
    assert len(json.loads(call.function.arguments)["tags"]) == 41
    calls, reason, content = streamed(client, **kw)
    assert reason == "tool_calls" and content == "" and list(calls) == [0]
    assert calls[0]["name"] == "get_weather"
    assert calls[0]["arguments"] == call.function.arguments
    assert calls[0]["id"].startswith("chatcmpl-tool-") and calls[0]["id"] != call.id


def test_none_and_auto_answer_as_content(client):
    # The small model answers in prose here: content, no calls, EOS text not returned.
    for kind in ("none", "auto"):
        choice = create(client, tool_choice=kind, max_tokens=400).choices[0]
        assert not choice.message.tool_calls and choice.message.content
        assert "<|im_end|>" not in choice.message.content


def test_an_empty_tools_array_is_an_omitted_one(server):
    """As vLLM 0.34 (and OpenAI): `tools: []` is no tools; "auto" and "required" have
    nothing to call and answer as "none"; a named tool still names one that is not there."""
    with httpx.Client(base_url=server, timeout=60) as c:
        plain = c.post("/v1/chat/completions", json={
            "messages": ASK, "max_tokens": 8, "temperature": 0}).json()
        for extra in ({}, {"tool_choice": "auto"}, {"tool_choice": "required"},
                      {"tool_choice": "none"}):
            r = c.post("/v1/chat/completions", json={
                "messages": ASK, "max_tokens": 8, "temperature": 0, "tools": [], **extra})
            assert r.status_code == 200, (extra, r.text)
            message = r.json()["choices"][0]["message"]
            assert not message.get("tool_calls")
            # The same prompt as without tools: the template saw none.
            assert message["content"] == plain["choices"][0]["message"]["content"], extra
        r = c.post("/v1/chat/completions", json={
            "messages": ASK, "max_tokens": 8, "tools": [], "tool_choice": NAMED})
        assert r.status_code == 400
        assert r.json()["error"]["message"] == ("The tool specified in `tool_choice` does not "
                                                "match any of the specified `tools`")


def test_history_with_tool_results_renders(server, client):
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call1", "content": "21 C and sunny"}]
    ids = httpx.post(server + "/tokenize", json={"messages": history, "tools": TOOLS},
                     timeout=30).json()["tokens"]
    prompt = default_tokenizer().decode(ids)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\n21 C and sunny\n</tool_response>" in prompt
    assert '"name": "get_time"' in prompt  # the tools are listed for the model
    choice = create(client, messages=history, tool_choice="none", max_tokens=20).choices[0]
    assert choice.message.content


BAD = [
    ({"tool_choice": "auto"}, "tool_choice", False),  # tool_choice without tools
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", True),
    ({"tool_choice": "sometimes"}, "tool_choice", True),
    ({"tool_choice": {"type": "function"}}, "tool_choice.function", True),
    ({"tool_choice": NAMED, "structured_outputs": {"json": WEATHER}}, "tool_choice", True),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, None, False),
]


def test_bad_tool_requests_then_canary(server):
    with httpx.Client(base_url=server, timeout=60) as c:
        for body, param, with_tools in BAD:
            full = {"messages": ASK, **({"tools": TOOLS} if with_tools else {}), **body}
            r = c.post("/v1/chat/completions", json=full)
            assert r.status_code == 400, (body, r.text)
            if param is not None:
                assert r.json()["error"]["param"] == param, (body, r.text)
        canary = c.post("/v1/chat/completions", json={
            "messages": ASK, "max_tokens": 5, "temperature": 0}).json()
        assert canary["choices"][0]["message"]["content"]


def test_langchain(server):
    pytest.importorskip("langchain_openai", reason="langchain-openai is not installed")
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, ConfigDict, Field

    class get_weather(BaseModel):
        """Current weather in a city."""

        model_config = ConfigDict(extra="forbid")
        city: str = Field(max_length=20)

    llm = ChatOpenAI(base_url=server + "/v1", api_key="x", model="SmolLM2-135M-Instruct", temperature=0,
                     max_tokens=200, max_retries=0)
    reply = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(
        "What is the weather like in Paris?")
    assert len(reply.tool_calls) == 1, reply
    call = reply.tool_calls[0]
    assert call["name"] == "get_weather" and isinstance(call["args"].get("city"), str)

    class City(BaseModel):
        model_config = ConfigDict(extra="forbid")
        name: str = Field(max_length=30)
        country: str = Field(max_length=30)

    city = llm.with_structured_output(City, method="json_schema").invoke(
        "Name a city in France.")
    assert isinstance(city, City) and city.name
