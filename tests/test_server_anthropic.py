"""Anthropic's Messages API against the real server and the official anthropic SDK:
create (text, system as a string and as blocks, stop sequences, max_tokens), stream (the
same text as create at temperature 0, Anthropic's event order on the wire), forced tool use
(`tool` and `any`, input valid against input_schema), a tool_result turn rendered as chat
renders it, count_tokens equal to create's input tokens, x-api-key and Bearer keys, every
error path in Anthropic's envelope (and the SDK's matching exception), a client that
leaves a stream freeing its request at once, a mid-stream failure as an `error` event, and
a canary after the errors."""

from __future__ import annotations

import contextlib
import json
import random
import signal
import threading
import time
from collections.abc import Iterator

import anthropic
import httpx
import jsonschema
import orjson
import pytest
from server.api.anthropic.render import MessageStream, message_body, stop_reason_of
from server.api.common.chat_body import to_chat
from server.api.common.messages_body import chat_request
from server.api.common.messages_protocol import AnthropicMessagesRequest
from server.config import ServerConfig
from server.frontend.chat.tool_calls import choice_factory
from server.frontend.chat.tools import plan_tools
from server.frontend.service import (
    ChoiceDelta,
    ChoiceResult,
    Collected,
    Logprobs,
    Prompt,
    Usage,
)
from server_helpers import ROOT, ServerProcess, metric

MODEL = "SmolLM2-135M-Instruct"
KEY = "x"
TEMPLATE = str(ROOT / "examples" / "tool_chat_template_chatml_hermes.jinja")
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
           "required": ["city"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "Current weather in a city",
          "input_schema": WEATHER},
         {"name": "get_time", "input_schema": TIME}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]
HELLO = [{"role": "user", "content": "Write one sentence about the sea."}]
GREEDY = {"temperature": 0}  # this SDK has no temperature argument: it goes in extra_body
HEADERS = {"x-api-key": KEY}
STORY = {"model": MODEL, "max_tokens": 300, "temperature": 0, "stream": True,
         "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}]}


@pytest.fixture(scope="module")
def server():
    # Two sequences at most, none queued: a third request is refused as overloaded.
    proc = ServerProcess("--api-key", KEY, "--enable-auto-tool-choice", "--tool-call-parser",
                         "hermes", "--chat-template", TEMPLATE, "--max-num-seqs", "2",
                         "--max-queued-requests", "0").wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def url(server):
    return server.url


@pytest.fixture(scope="module")
def client(url):
    with anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0) as c:
        yield c


def create(client, **kw):
    kw.setdefault("messages", HELLO)
    kw.setdefault("max_tokens", 24)
    kw["extra_body"] = {**GREEDY, **kw.get("extra_body", {})}
    return client.messages.create(model=MODEL, **kw)


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def sse_records(response: httpx.Response) -> list[tuple[str, dict]]:
    """(event name, data) of every record; each record must have both lines."""
    records, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            assert name is not None, line
            records.append((name, orjson.loads(line[len("data: "):])))
            name = None
    return records


def check_envelope(response: httpx.Response, status: int, kind: str,
                   message: str | None = None) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if message is not None:
        assert body["error"]["message"] == message
    return body["error"]["message"]


def test_create_text_and_system(client):
    r = create(client, system="You are a poet.")
    assert r.id.startswith("msg_") and r.type == "message" and r.role == "assistant"
    assert r.model == MODEL and r.content[0].type == "text" and text_of(r)
    assert r.stop_reason in ("end_turn", "max_tokens") and r.stop_sequence is None
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 24
    # System as text blocks renders as the same prompt, so greedy output is the same.
    blocks = create(client, system=[{"type": "text", "text": "You are a poet."}])
    assert text_of(blocks) == text_of(r) and blocks.usage.input_tokens == r.usage.input_tokens
    # Without one, the template's default system prompt is rendered instead.
    assert create(client).usage.input_tokens != r.usage.input_tokens


def test_stop_sequence_and_max_tokens(client):
    r = create(client, max_tokens=5)
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 5
    full = text_of(create(client, max_tokens=24))
    words = full.split()
    assert len(words) > 4, full
    stop = " " + words[3]
    cut = create(client, max_tokens=24, stop_sequences=[stop, "zzzz"])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert text_of(cut) == full[:full.index(stop)]


def test_stream_text_equals_create(client):
    whole = create(client, max_tokens=30)
    with client.messages.stream(model=MODEL, max_tokens=30, messages=HELLO,
                                extra_body=GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text_of(whole) == text_of(final)
    assert final.stop_reason == whole.stop_reason
    assert final.usage.input_tokens == whole.usage.input_tokens
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_stream_event_order_on_the_wire(url, client):
    whole = create(client, max_tokens=12, stop_sequences=["\n\n\n"])
    body = {"model": MODEL, "max_tokens": 12, "messages": HELLO, "stream": True,
            "stop_sequences": ["\n\n\n"], **GREEDY}
    with httpx.stream("POST", url + "/v1/messages", json=body, headers=HEADERS,
                      timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        records = sse_records(r)
    for name, data in records:
        assert data["type"] == name
    names = [name for name, _ in records]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    start = records[0][1]["message"]
    assert start["content"] == [] and start["role"] == "assistant" and start["type"] == "message"
    assert start["usage"] == {"input_tokens": whole.usage.input_tokens, "output_tokens": 0}
    assert start["id"].startswith("msg_") and start["stop_reason"] is None
    assert records[1][1] == {"type": "content_block_start", "index": 0,
                             "content_block": {"type": "text", "text": ""}}
    deltas = [d for n, d in records if n == "content_block_delta"]
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for d in deltas)
    assert "".join(d["delta"]["text"] for d in deltas) == text_of(whole)
    assert records[-3][1] == {"type": "content_block_stop", "index": 0}
    end = records[-2][1]
    assert end["delta"] == {"stop_reason": whole.stop_reason, "stop_sequence": None}
    assert end["usage"]["output_tokens"] == whole.usage.output_tokens
    assert records[-1][1] == {"type": "message_stop"}


def check_tool_use(message, name: str | None = None) -> None:
    assert message.stop_reason == "tool_use", message
    uses = [b for b in message.content if b.type == "tool_use"]
    assert uses, message
    for use in uses:
        assert use.id.startswith("toolu_") and (name is None or use.name == name)
        jsonschema.validate(use.input, SCHEMAS[use.name])


@pytest.mark.parametrize("choice", [{"type": "tool", "name": "get_weather"},
                                    {"type": "any", "disable_parallel_tool_use": True}],
                         ids=["tool", "any"])
def test_forced_tool_use_whole_and_streamed(client, choice):
    name = choice.get("name")
    kw = {"messages": ASK, "max_tokens": 120, "tools": TOOLS, "tool_choice": choice}
    r = create(client, **kw)
    check_tool_use(r, name)
    if choice["type"] == "any":
        assert len(r.content) == 1  # disable_parallel_tool_use: one call
    with client.messages.stream(model=MODEL, extra_body=GREEDY, **kw) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    check_tool_use(final, name)
    assert [(b.name, b.input) for b in final.content] == [(b.name, b.input) for b in r.content]
    assert "input_json" in events and events[-1] == "message_stop"


def test_tool_result_turn_renders_as_chat(url, client):
    history = [
        ASK[0],
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": [{"type": "text", "text": "Sunny, 21 C"}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no such city",
             "is_error": True},
            {"type": "text", "text": "Thanks. And tomorrow?"}]},
    ]
    r = create(client, messages=history, tools=TOOLS, tool_choice={"type": "none"})
    assert r.stop_reason in ("end_turn", "max_tokens") and text_of(r)
    counted = client.messages.count_tokens(model=MODEL, messages=history, tools=TOOLS,
                                           tool_choice={"type": "none"}).input_tokens
    assert counted == r.usage.input_tokens
    # The chat messages it amounts to, through /tokenize (the chat route's rendering).
    chat = [ASK[0],
            {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}],
             "tool_calls": [{"id": "toolu_1", "type": "function", "function": {
                 "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny, 21 C"},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no such city"},
            {"role": "user", "content": [{"type": "text", "text": "Thanks. And tomorrow?"}]}]
    tools = [{"type": "function", "function": {"name": t["name"], **(
        {"description": t["description"]} if "description" in t else {}),
        "parameters": t["input_schema"]}} for t in TOOLS]
    tok = httpx.post(url + "/tokenize", headers=HEADERS,
                     json={"model": MODEL, "messages": chat, "tools": tools}).json()
    assert tok["count"] == counted
    assert "<tool_response>" in httpx.post(url + "/detokenize", headers=HEADERS, json={
        "model": MODEL, "tokens": tok["tokens"]}).json()["prompt"]
    without = client.messages.count_tokens(model=MODEL, messages=history[:1], tools=TOOLS)
    assert without.input_tokens < counted


def test_a_last_assistant_turn_is_continued(url, client):
    prefill = [HELLO[0], {"role": "assistant", "content": "The sea is"}]
    r = create(client, messages=prefill, max_tokens=8)
    assert r.stop_reason in ("end_turn", "max_tokens") and text_of(r)
    chat = httpx.post(url + "/v1/chat/completions", headers=HEADERS, json={
        "model": MODEL, "messages": prefill, "max_tokens": 8, "temperature": 0,
        "add_generation_prompt": False, "continue_final_message": True}).json()
    assert chat["choices"][0]["message"]["content"] == text_of(r)
    assert chat["usage"]["prompt_tokens"] == r.usage.input_tokens
    assert client.messages.count_tokens(model=MODEL, messages=prefill).input_tokens == \
        r.usage.input_tokens
    # An empty last assistant message prefills nothing: the same answer as without it.
    empty = create(client, messages=[HELLO[0], {"role": "assistant", "content": ""}],
                   max_tokens=8)
    plain = create(client, max_tokens=8)
    assert text_of(empty) == text_of(plain) and empty.usage.input_tokens == \
        plain.usage.input_tokens


def test_count_tokens_equals_create_usage(client):
    kw = {"messages": ASK, "system": [{"type": "text", "text": "Be brief."}], "tools": TOOLS,
          "tool_choice": {"type": "tool", "name": "get_time"}}
    counted = client.messages.count_tokens(model=MODEL, **kw)
    r = create(client, max_tokens=40, **kw)
    assert counted.input_tokens == r.usage.input_tokens > 0
    check_tool_use(r, "get_time")
    plain = client.messages.count_tokens(model=MODEL, messages=HELLO)
    assert plain.input_tokens == create(client, max_tokens=2).usage.input_tokens


def test_output_config_format_constrains_the_text(client):
    fmt = {"format": {"type": "json_schema", "schema": WEATHER}}
    r = create(client, messages=ASK, max_tokens=60, output_config=fmt,
               thinking={"type": "disabled"})
    assert r.stop_reason == "end_turn", r
    jsonschema.validate(json.loads(text_of(r)), WEATHER)
    with client.messages.stream(model=MODEL, messages=ASK, max_tokens=60, output_config=fmt,
                                extra_body=GREEDY) as stream:
        assert "".join(stream.text_stream) == text_of(r)


def test_api_key_headers(url):
    body = {"model": MODEL, "max_tokens": 3, "messages": HELLO}
    with anthropic.Anthropic(base_url=url, auth_token=KEY, api_key=None, max_retries=0) as c:
        assert c.messages.create(**body).usage.output_tokens >= 1  # Authorization: Bearer
    with anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0) as c:
        with pytest.raises(anthropic.AuthenticationError) as err:
            c.messages.create(**body)
        assert err.value.body == {"type": "error", "error": {
            "type": "authentication_error", "message": "Invalid or missing API key."}}
        with pytest.raises(anthropic.AuthenticationError):
            c.messages.count_tokens(model=MODEL, messages=HELLO)
    for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong"}):
        r = httpx.post(url + "/v1/messages", json=body, headers=headers)
        check_envelope(r, 401, "authentication_error", "Invalid or missing API key.")
    # The OpenAI routes keep their own envelope and take x-api-key too.
    r = httpx.post(url + "/v1/chat/completions", json=body)
    assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=HEADERS)
    assert r.status_code == 200


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
DROP = object()  # the field is left out
BAD = [
    ({"max_tokens": DROP}, "invalid_request_error"),
    ({"max_tokens": 0}, "invalid_request_error"),
    ({"max_tokens": "ten"}, "invalid_request_error"),
    ({"max_tokens": 10**6}, "invalid_request_error"),
    ({"messages": []}, "invalid_request_error"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "invalid_request_error"),
    ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "invalid_request_error"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "invalid_request_error"),
    ({"messages": [{"role": "user", "content": [IMAGE]}]}, "invalid_request_error"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a",
                                                 "content": [IMAGE]}]}]},
     "invalid_request_error"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_result",
                                                      "tool_use_id": "a"}]}]},
     "invalid_request_error"),
    ({"system": 5}, "invalid_request_error"),
    ({"temperature": 2.5}, "invalid_request_error"),
    ({"temperature": "hot"}, "invalid_request_error"),
    ({"top_p": 0}, "invalid_request_error"),
    ({"top_k": -2}, "invalid_request_error"),
    ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "invalid_request_error"),
    ({"stop_sequences": "a"}, "invalid_request_error"),
    ({"tools": [{"name": "f"}]}, "invalid_request_error"),
    ({"tool_choice": {"type": "any"}}, "invalid_request_error"),  # no tools
    ({"tools": TOOLS, "tool_choice": {"type": "tool"}}, "invalid_request_error"),
    ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}},
     "invalid_request_error"),
    ({"tools": TOOLS, "tool_choice": {"type": "sometimes"}}, "invalid_request_error"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "nope"}}}},
     "invalid_request_error"),
    ({"output_config": {"format": {"type": "regex"}}}, "invalid_request_error"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "invalid_request_error"),
    ({"thinking": {"type": "enabled", "budget_tokens": 10}, "max_tokens": 2000},
     "invalid_request_error"),
    ({"model": "gpt-9"}, "not_found_error"),
]


@pytest.mark.parametrize("change,kind", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_requests_get_the_envelope(url, change, kind):
    body = {"model": MODEL, "max_tokens": 8, "messages": HELLO, **change}
    body = {k: v for k, v in body.items() if v is not DROP}
    status = 404 if kind == "not_found_error" else 400
    check_envelope(httpx.post(url + "/v1/messages", json=body, headers=HEADERS), status, kind)


def test_error_messages_match_chat_and_the_sdk_raises(url, client):
    exact = [({"temperature": 2.5}, "temperature must be in [0.0, 2.0], got 2.5"),
             ({"max_tokens": 0}, "max_tokens must be at least 1, got 0"),
             ({"messages": [{"role": "user", "content": [IMAGE]}]},
              "image content blocks are not supported: the served model reads text only"),
             ({"model": "gpt-9"},
              f"The model `gpt-9` does not exist. Valid models: {MODEL}.")]
    for change, message in exact:
        body = {"model": MODEL, "max_tokens": 8, "messages": HELLO, **change}
        status = 404 if "model" in change else 400
        got = check_envelope(httpx.post(url + "/v1/messages", json=body, headers=HEADERS),
                             status, "not_found_error" if status == 404 else
                             "invalid_request_error", message)
        if "messages" not in change:  # the chat route words it the same
            chat = httpx.post(url + "/v1/chat/completions", json=body, headers=HEADERS)
            assert chat.json()["error"]["message"] == got
    with pytest.raises(anthropic.BadRequestError) as err:
        create(client, max_tokens=0)
    assert err.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="gpt-9", max_tokens=4, messages=HELLO)
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="gpt-9", messages=HELLO)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model=MODEL, messages=[{"role": "user",
                                                             "content": [IMAGE]}])
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model=MODEL, messages=[])
    # Unknown fields are ignored, as vLLM's models ignore them.
    assert create(client, max_tokens=2, extra_body={"no_such_field": 1},
                  metadata={"user_id": "u1"}).usage.output_tokens == 2


def test_transport_errors_on_anthropic_routes(url):
    raw = httpx.post(url + "/v1/messages", content=b"{not json", headers=dict(
        HEADERS, **{"Content-Type": "application/json"}))
    check_envelope(raw, 400, "invalid_request_error")
    text = httpx.post(url + "/v1/messages", content=b"{}", headers=dict(
        HEADERS, **{"Content-Type": "text/plain"}))
    check_envelope(text, 400, "invalid_request_error")
    check_envelope(httpx.post(url + "/v1/messages/nope", json={}, headers=HEADERS), 404,
                   "not_found_error")
    check_envelope(httpx.get(url + "/v1/messages", headers=HEADERS), 405,
                   "invalid_request_error")
    big = b'{"model": "%s", "messages": [], "x": "%s"}' % (MODEL.encode(), b"a" * (5 << 20))
    check_envelope(httpx.post(url + "/v1/messages", content=big, headers=dict(
        HEADERS, **{"Content-Type": "application/json"})), 413, "request_too_large")
    # Other routes keep OpenAI's envelope.
    r = httpx.post(url + "/v1/nope", json={}, headers=HEADERS)
    assert r.status_code == 404 and set(r.json()) == {"error"}
    # The canary: the server goes on serving, unchanged.
    r = httpx.post(url + "/v1/messages", headers=HEADERS, json={
        "model": MODEL, "max_tokens": 4, "messages": HELLO, **GREEDY})
    assert r.status_code == 200 and r.json()["usage"]["output_tokens"] >= 1


def idle_state(url: str) -> dict[str, float | None]:
    text = httpx.get(url + "/metrics", headers=HEADERS).text
    return {name: metric(text, name, model_name=MODEL) for name in
            ("vllm:num_requests_running", "vllm:num_requests_waiting",
             "vllm:kv_cache_usage_perc")}


def aborted(url: str) -> float:
    text = httpx.get(url + "/metrics", headers=HEADERS).text
    return metric(text, "vllm:request_success_total", model_name=MODEL,
                  finished_reason="abort") or 0.0


def wait_idle(url: str, before: dict[str, float | None], within: float = 2.0) -> None:
    deadline = time.monotonic() + within
    while idle_state(url) != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert idle_state(url) == before


def read_until_text(r: httpx.Response) -> Iterator[str]:
    """Reads up to the first text; the caller keeps the lines (a dropped iterator would
    close the response)."""
    lines = r.iter_lines()
    for line in lines:
        if line.startswith("data: ") and "text_delta" in line:
            return lines
    raise AssertionError("the stream ended before any text")


def test_leaving_a_stream_aborts_it_and_frees_its_kv(url, client):
    before, aborts = idle_state(url), aborted(url)
    for _ in range(3):
        with httpx.stream("POST", url + "/v1/messages", json=STORY, headers=HEADERS,
                          timeout=60) as r:
            read_until_text(r)  # then leave, hundreds of tokens early
    wait_idle(url, before)
    assert aborted(url) - aborts == 3
    assert create(client, max_tokens=3).usage.output_tokens == 3  # canary
    text = httpx.get(url + "/metrics", headers=HEADERS).text
    assert metric(text, "http_requests_total", handler="/v1/messages", method="POST",
                  status="2xx") >= 4


def test_full_server_answers_overloaded(url, client):
    before = idle_state(url)
    with contextlib.ExitStack() as stack:
        held = [read_until_text(stack.enter_context(httpx.stream(
            "POST", url + "/v1/messages", json=STORY, headers=HEADERS, timeout=60)))
            for _ in range(2)]  # every seat taken
        assert idle_state(url)["vllm:num_requests_running"] == 2
        r = httpx.post(url + "/v1/messages", json=dict(STORY, stream=False), headers=HEADERS)
        check_envelope(r, 503, "overloaded_error")
        assert int(r.headers["retry-after"]) >= 1
        with pytest.raises(anthropic.ServiceUnavailableError) as err:
            create(client, max_tokens=2)
        assert err.value.body["error"]["type"] == "overloaded_error"
    del held
    wait_idle(url, before)
    assert create(client, max_tokens=2).usage.output_tokens == 2


def test_request_id_header_names_the_message(url):
    r = httpx.post(url + "/v1/messages", headers=dict(HEADERS, **{"X-Request-Id": "abc-1"}),
                   json={"model": MODEL, "max_tokens": 2, "messages": HELLO})
    assert r.status_code == 200 and r.json()["id"] == "msg_abc-1"


def test_mid_stream_failure_is_an_error_event():
    srv = ServerProcess(env={"LLMSERVE_FAULT_AFTER_STEPS": "30"}).wait_ready()
    try:
        plain: list = []
        with httpx.stream("POST", srv.url + "/v1/messages", json=STORY, timeout=60) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            first = next(lines)
            worker = threading.Thread(target=lambda: plain.append(httpx.post(
                srv.url + "/v1/messages", timeout=60, json=dict(STORY, stream=False))))
            worker.start()
            records = sse_records(_Lines([first, *lines]))
            worker.join()
        names = [n for n, _ in records]
        assert names[0] == "message_start" and "content_block_delta" in names
        assert names[-2:] == ["content_block_stop", "error"] and "message_stop" not in names
        err = records[-1][1]
        assert set(err) == {"type", "error"} and err["type"] == "error"
        assert err["error"]["type"] == "api_error" and "Injected" not in err["error"]["message"]
        check_envelope(plain[0], 500, "api_error")
        assert srv.wait(30) == 1
    finally:
        srv.stop(signal.SIGKILL)


class _Lines:
    """Lines already read, in the shape sse_records reads."""

    def __init__(self, lines: list[str]) -> None:
        self._lines = lines

    def iter_lines(self):
        return iter(self._lines)


# -- the auto path, which the small model does not take on its own: scripted Hermes output
# through the real translation, tool plan and renderer, streamed in random splits and whole.
HERMES_CALLS = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
                '{"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
                '{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>')


class _Gen:
    """The part of a TextGeneration the renderer reads."""

    request_id = "test"
    prompts = (Prompt("p", [1, 2, 3], "p"),)


def _choice(**body):
    req = AnthropicMessagesRequest.model_validate(
        {"model": MODEL, "max_tokens": 50, "messages": ASK, "tools": TOOLS, **body})
    config = ServerConfig(enable_auto_tool_choice=True, tool_call_parser="hermes")
    return choice_factory(plan_tools(to_chat(chat_request(req)), config))()


def _streamed(pieces: list[str], **body) -> list[tuple[str, dict]]:
    s = MessageStream(_Gen(), model=MODEL, choice=_choice(**body))
    out = s.start()
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        out += s.delta(ChoiceDelta(0, piece, [7], Logprobs([]), "stop" if last else None,
                                   None, i + 1))
    out += s.finish(Usage(3, len(pieces)))
    records = []
    for raw in out:
        head, data = raw.decode().strip().split("\n")
        records.append((head.removeprefix("event: "), orjson.loads(data.removeprefix("data: "))))
    return records


@pytest.mark.parametrize("seed", range(6))
def test_auto_tool_calls_streamed_and_whole_agree(seed):
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(HERMES_CALLS)), rng.randint(1, 30)))
    pieces = [HERMES_CALLS[a:b] for a, b in zip([0, *cuts], [*cuts, len(HERMES_CALLS)])]
    records = _streamed(pieces)
    assert all(name == data["type"] for name, data in records)
    blocks: list[dict] = []
    for name, data in records:
        if name == "content_block_start":
            assert data["index"] == len(blocks)
            blocks.append(dict(data["content_block"], json=""))
        elif name == "content_block_delta":
            assert data["index"] == len(blocks) - 1
            delta = data["delta"]
            if delta["type"] == "text_delta":
                blocks[-1]["text"] += delta["text"]
            else:
                blocks[-1]["json"] += delta["partial_json"]
    assert [b["type"] for b in blocks] == ["text", "tool_use", "tool_use"]
    assert blocks[0]["text"].strip() == "Let me check."
    assert [(b["name"], json.loads(b["json"])) for b in blocks[1:]] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]
    assert all(b["id"].startswith("toolu_") for b in blocks[1:])
    assert records[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    whole = message_body(_Gen(), Collected([ChoiceResult(0, HERMES_CALLS, [7], Logprobs([]),
                                                         "stop", None)], [None], Usage(3, 1)),
                         model=MODEL, choice=_choice())
    assert [(b["type"], b.get("name"), b.get("input")) for b in whole["content"]] == [
        ("text", None, None), ("tool_use", "get_weather", {"city": "Paris"}),
        ("tool_use", "get_time", {"zone": "CET"})]
    assert whole["content"][0]["text"].strip() == "Let me check."
    assert whole["stop_reason"] == "tool_use"
    # disable_parallel_tool_use keeps the first call, streamed and whole.
    one = {"tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}
    starts = [d["content_block"] for n, d in _streamed(pieces, **one)
              if n == "content_block_start"]
    assert [b["type"] for b in starts] == ["text", "tool_use"]
    whole = message_body(_Gen(), Collected([ChoiceResult(0, HERMES_CALLS, [7], Logprobs([]),
                                                         "stop", None)], [None], Usage(3, 1)),
                         model=MODEL, choice=_choice(**one))
    assert [b["type"] for b in whole["content"]] == ["text", "tool_use"]


def test_stop_reason_mapping():
    assert stop_reason_of("length", None, tool_used=True, tool_complete=False) == (
        "max_tokens", None)
    assert stop_reason_of("stop", "END", tool_used=False, tool_complete=False) == (
        "stop_sequence", "END")
    assert stop_reason_of("stop", 2, tool_used=False, tool_complete=False) == ("end_turn", None)
    assert stop_reason_of("stop", None, tool_used=False, tool_complete=False) == (
        "end_turn", None)
    assert stop_reason_of("stop", "END", tool_used=True, tool_complete=True) == (
        "tool_use", None)
    assert stop_reason_of("stop", "END", tool_used=True, tool_complete=False) == (
        "stop_sequence", "END")
