"""JSON nested inside a request body as a string, against the real server: a tool call's
`arguments` in a chat history (messages[].tool_calls[].function.arguments) and in
Responses input items (input[].arguments), 100 000 `[` deep or just past the body's own
nesting bound, and the JSON-text fields the structured-output paths decode
(structured_outputs.json and guided_json, response_format and text.format schemas given
as strings, on chat, completions and Responses; Anthropic's tool_use input must be an
object, held by the body's own bound). Each is a 400 in the OpenAI error envelope naming the
field, never a 500 with a traceback; then /health answers and a chat completion runs."""

from __future__ import annotations

import httpx
import pytest
from server.json_depth import MAX_JSON_DEPTH

DEEP = "[" * 100_000
JUST_TOO_DEEP = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
ASK = {"role": "user", "content": "What is the weather like in Paris?"}


def history(arguments: str, calls_before: int = 0) -> list[dict]:
    calls = [{"id": f"call{i}", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
             for i in range(calls_before)]
    calls.append({"id": "deep", "type": "function",
                  "function": {"name": "get_weather", "arguments": arguments}})
    return [ASK, {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "tool_call_id": "deep", "content": "21 C"}]


def responses_input(arguments: str) -> list[dict]:
    return [{"role": "user", "content": "Weather?"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather",
             "arguments": '{"city": "Paris"}'},
            {"type": "function_call", "call_id": "c2", "name": "get_weather",
             "arguments": arguments},
            {"type": "function_call_output", "call_id": "c2", "output": "21 C"}]


def schema_format(schema: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


# (id, route, body, the param the 400 names)
CASES = [
    ("chat-arguments-100k", "/v1/chat/completions", {"messages": history(DEEP)},
     "messages[1].tool_calls[0].function.arguments"),
    ("chat-arguments-one-level-too-deep", "/v1/chat/completions",
     {"messages": history(JUST_TOO_DEEP, calls_before=2)},
     "messages[1].tool_calls[2].function.arguments"),
    ("chat-arguments-objects", "/v1/chat/completions", {"messages": history('{"a": ' * 50_000)},
     "messages[1].tool_calls[0].function.arguments"),
    ("responses-arguments-100k", "/v1/responses", {"input": responses_input(DEEP)},
     "input[2].arguments"),
    ("responses-arguments-one-level-too-deep", "/v1/responses",
     {"input": responses_input(JUST_TOO_DEEP)}, "input[2].arguments"),
    ("chat-structured-json", "/v1/chat/completions",
     {"messages": [ASK], "structured_outputs": {"json": DEEP}}, "structured_outputs.json"),
    ("chat-guided-json", "/v1/chat/completions", {"messages": [ASK], "guided_json": DEEP},
     "guided_json"),
    ("completions-structured-json", "/v1/completions",
     {"prompt": "Weather:", "structured_outputs": {"json": DEEP}}, "structured_outputs.json"),
    ("chat-response-format-schema", "/v1/chat/completions",
     {"messages": [ASK], "response_format": schema_format(DEEP)}, "response_format"),
    ("responses-text-format-schema", "/v1/responses", {"input": "Weather?", "text": {"format": {
        "type": "json_schema", "name": "x", "schema": DEEP}}}, "text.format.schema"),
]


@pytest.fixture(scope="module")
def server(plain_server):
    return plain_server


@pytest.mark.parametrize("route,body,param", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_deep_json_strings_are_400s_naming_the_field(server, route, body, param):
    body = {"model": "SmolLM2-135M-Instruct", "max_tokens": 5, **body}
    if route == "/v1/responses":
        body.pop("max_tokens")
    r = httpx.post(server.url + route, json=body, timeout=60)
    assert r.status_code == 400, (route, param, r.text[:500])
    error = r.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert error["param"] == param, error
    assert "Traceback" not in r.text


def test_server_keeps_serving_after_deep_json(server):
    for _, route, body, _ in CASES[:2]:
        httpx.post(server.url + route, json={"max_tokens": 5, **body}, timeout=60)
    assert "Traceback" not in server.log(None)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    canary = httpx.post(server.url + "/v1/chat/completions", json={
        "messages": [ASK], "max_tokens": 5, "temperature": 0}, timeout=60).json()
    assert canary["choices"][0]["message"]["content"]


def test_brackets_inside_argument_strings_are_no_nesting(server):
    # Only structure counts: a string value full of brackets beside arrays nested to the
    # bound (the object and 63 arrays: 64 levels).
    inner = MAX_JSON_DEPTH - 1
    arguments = '{"code": "' + "[{" * 5_000 + '", "deep": ' + "[" * inner + "]" * inner + "}"
    r = httpx.post(server.url + "/v1/chat/completions", json={
        "messages": history(arguments), "max_tokens": 3, "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text[:500]
