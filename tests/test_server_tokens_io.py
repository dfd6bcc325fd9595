"""Tokens in, tokens out on a real `python -m server --enable-scale-out`: /inference/v1/generate
and abort_requests, the render routes, the derender routes; and what --tokens-only refuses.

The invariants: generate on a token-id prompt gives the tokens /v1/completions gives for the
same prompt at temperature 0; render gives the ids /tokenize gives, and its body, sent to
generate, gives what /v1/chat/completions gives; derender of a generate response gives the
coupled route's response; an abort ends a running stream with finish_reason "abort" and
frees the server.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from server_helpers import ServerProcess, sse_data

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Name three fruits."}]


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--enable-scale-out").wait_ready()
    yield srv.url
    assert srv.stop() == 0, srv.log()


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=300)


def prompt_ids(url: str, text: str) -> list[int]:
    return post(url, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()["tokens"]


def detokenize(url: str, ids: list[int]) -> str:
    return post(url, "/detokenize", {"tokens": ids}).json()["prompt"]


def generate(url: str, ids: list[int], **fields) -> httpx.Response:
    sampling = fields.pop("sampling_params", {})
    return post(url, "/inference/v1/generate", {
        "token_ids": ids, "sampling_params": {"temperature": 0, "max_tokens": 16, **sampling},
        **fields})


def test_generate_equals_completions_on_the_same_token_ids(server):
    ids = prompt_ids(server, "The three primary colors are")
    r = generate(server, ids, sampling_params={"logprobs": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["request_id"].startswith("generate-tokens-")
    assert body["output_mode"] == "tokens"
    (choice,) = body["choices"]
    assert set(choice) == {"index", "finish_reason", "stop_reason", "token_ids",
                           "routed_experts", "sampling_mask", "weight_versions", "logprobs"}
    cmpl = post(server, "/v1/completions", {"prompt": ids, "temperature": 0, "max_tokens": 16,
                                            "logprobs": 2}).json()
    expected = cmpl["choices"][0]
    # Token by token: each generated id is the token completions reports at that position.
    assert [detokenize(server, [t]) for t in choice["token_ids"]] == \
        expected["logprobs"]["tokens"]
    assert detokenize(server, choice["token_ids"]) == expected["text"]
    assert choice["finish_reason"] == expected["finish_reason"]
    assert body["usage"]["prompt_tokens"] == cmpl["usage"]["prompt_tokens"] == len(ids)
    assert body["usage"]["completion_tokens"] == cmpl["usage"]["completion_tokens"] \
        == len(choice["token_ids"])
    # logprobs: integer ids; the sampled token first, then the top ones
    content = choice["logprobs"]["content"]
    assert [e["token_id"] for e in content] == choice["token_ids"]
    for entry, logprob in zip(content, expected["logprobs"]["token_logprobs"], strict=True):
        assert entry["logprob"] == pytest.approx(logprob, abs=0.02)  # bf16 noise
        assert entry["top_logprobs"][0]["token_id"] == entry["token_id"]
        assert entry["rank"] == 1  # greedy: the sampled token is the most likely

    text = generate(server, ids, output_mode="text").json()
    assert text["output_mode"] == "text"
    assert text["choices"][0]["text"] == expected["text"]
    assert text["choices"][0]["token_ids"] == choice["token_ids"]


def test_generate_stream_gives_the_same_tokens(server):
    ids = prompt_ids(server, "Once upon a time")
    whole = generate(server, ids).json()["choices"][0]
    with httpx.stream("POST", server + "/inference/v1/generate", timeout=300, json={
            "token_ids": ids, "sampling_params": {"temperature": 0, "max_tokens": 16},
            "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}) as r:
        assert r.status_code == 200
        data = sse_data(r.iter_lines())
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    usage = chunks.pop()
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == \
        len(whole["token_ids"])
    assert chunks[0]["prompt_token_ids"] == ids
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == whole["token_ids"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["finish_reason"]


def test_abort_ends_a_running_stream_and_frees_it(server):
    ids = prompt_ids(server, "Count from one to a thousand:")
    chunks, aborted = [], False
    with httpx.stream("POST", server + "/inference/v1/generate", timeout=300, json={
            "token_ids": ids, "request_id": "abort-me", "stream": True,
            "sampling_params": {"max_tokens": 900, "ignore_eos": True}}) as r:
        for line in r.iter_lines():  # read as it comes: the abort goes mid-stream
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                break
            chunk = json.loads(line[6:])
            chunks.append(chunk)
            if not aborted and chunk["choices"][0]["token_ids"]:
                assert chunk["request_id"] == "generate-tokens-abort-me"
                a = post(server, "/inference/v1/abort_requests",
                         {"request_ids": [chunk["request_id"]]})
                assert a.status_code == 200 and a.content == b""
                aborted = True
    assert aborted
    assert chunks[-1]["choices"][0]["finish_reason"] == "abort"
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) < 900
    deadline = time.monotonic() + 10
    while httpx.get(server + "/load").json()["server_load"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(server + "/load").json()["server_load"] == 0
    assert post(server, "/inference/v1/abort_requests",
                {"request_ids": ["generate-tokens-unknown"]}).status_code == 200
    r = post(server, "/inference/v1/abort_requests", {})
    assert r.status_code == 400 and r.json()["error"]["param"] == "request_ids"


def test_chat_render_equals_tokenize_and_generates_what_chat_does(server):
    r = post(server, "/v1/chat/completions/render",
             {"messages": MESSAGES, "temperature": 0, "max_tokens": 12})
    assert r.status_code == 200, r.text
    rendered = r.json()
    tokens = post(server, "/tokenize", {"messages": MESSAGES}).json()["tokens"]
    assert rendered["token_ids"] == tokens
    assert rendered["request_id"].startswith("chatcmpl-")
    sp = rendered["sampling_params"]
    assert sp["max_tokens"] == 12 and sp["temperature"] == 0 and sp["output_kind"] == 2
    assert "n" not in sp  # vLLM writes only what differs from its defaults
    assert rendered["parse_context"]["tool_choice"] == "none"
    assert rendered["stream"] is False and rendered["output_mode"] == "tokens"
    # Without a max_tokens the render resolves it against the prompt, as vLLM does.
    unbounded = post(server, "/v1/chat/completions/render", {"messages": MESSAGES}).json()
    assert unbounded["sampling_params"]["max_tokens"] == 1024 - len(tokens)

    out = post(server, "/inference/v1/generate", {**rendered, "output_mode": "text"}).json()
    chat = post(server, "/v1/chat/completions",
                {"messages": MESSAGES, "temperature": 0, "max_tokens": 12}).json()
    assert out["choices"][0]["text"] == chat["choices"][0]["message"]["content"]
    assert out["usage"]["prompt_tokens"] == chat["usage"]["prompt_tokens"]


def test_messages_render_equals_what_messages_computes(server):
    body = {"model": "SmolLM2-135M-Instruct", "max_tokens": 12, "temperature": 0,
            "system": "Be brief.", "messages": [{"role": "user", "content": "Name a fruit."}]}
    r = post(server, "/v1/messages/render", body)
    assert r.status_code == 200, r.text
    rendered = r.json()
    msg = post(server, "/v1/messages", body).json()
    assert len(rendered["token_ids"]) == msg["usage"]["input_tokens"]
    counted = post(server, "/v1/messages/count_tokens",
                   {k: body[k] for k in ("model", "system", "messages")}).json()
    assert counted["input_tokens"] == len(rendered["token_ids"])
    assert rendered["sampling_params"]["max_tokens"] == 12
    out = post(server, "/inference/v1/generate", {**rendered, "output_mode": "text"}).json()
    assert out["choices"][0]["text"] == msg["content"][0]["text"]
    # a bad body gets Anthropic's envelope, as on /v1/messages
    r = post(server, "/v1/messages/render", {"messages": body["messages"]})
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_completions_render_gives_one_body_per_prompt(server):
    r = post(server, "/v1/completions/render",
             {"prompt": ["Hello there", "General Kenobi"], "max_tokens": 5, "request_id": "x"})
    assert r.status_code == 200, r.text
    first, second = r.json()
    for body, text in ((first, "Hello there"), (second, "General Kenobi")):
        assert body["token_ids"] == post(server, "/tokenize", {"prompt": text}).json()["tokens"]
    assert (first["request_id"], second["request_id"]) == ("cmpl-x-0", "cmpl-x-1")
    assert first["sampling_params"]["max_tokens"] == 5 and first["parse_context"] is None
    (ids,) = post(server, "/v1/completions/render", {"prompt": [1, 2, 3]}).json()
    assert ids["token_ids"] == [1, 2, 3] and ids["request_id"].startswith("cmpl-")
    assert "max_tokens" not in ids["sampling_params"]  # completions' 16: vLLM's default


def test_derender_gives_the_coupled_responses(server):
    rendered = post(server, "/v1/chat/completions/render",
                    {"messages": MESSAGES, "temperature": 0, "max_tokens": 12}).json()
    gen = post(server, "/inference/v1/generate", {
        **rendered, "sampling_params": {**rendered["sampling_params"], "logprobs": 2}}).json()
    chat_request = {"messages": MESSAGES, "logprobs": True, "top_logprobs": 2}
    r = post(server, "/v1/chat/completions/derender", {
        "generate_response": gen, "prompt_tokens": len(rendered["token_ids"]),
        "prompt_token_ids": rendered["token_ids"], "chat_request": chat_request})
    assert r.status_code == 200, r.text
    derendered = r.json()
    chat = post(server, "/v1/chat/completions",
                {**chat_request, "temperature": 0, "max_tokens": 12}).json()
    assert derendered["choices"][0]["message"] == chat["choices"][0]["message"]
    assert derendered["choices"][0]["finish_reason"] == chat["choices"][0]["finish_reason"]
    # The same tokens and alternatives; the values within bf16 noise (the chat request
    # reuses the cached prompt blocks).
    got, want = (c["choices"][0]["logprobs"]["content"] for c in (derendered, chat))
    assert [(e["token"], e["bytes"], [t["token"] for t in e["top_logprobs"]]) for e in got] == \
        [(e["token"], e["bytes"], [t["token"] for t in e["top_logprobs"]]) for e in want]
    assert [e["logprob"] for e in got] == pytest.approx([e["logprob"] for e in want], abs=0.02)
    assert derendered["usage"]["total_tokens"] == chat["usage"]["total_tokens"]

    ids = prompt_ids(server, "The three primary colors are")
    gen = generate(server, ids).json()
    r = post(server, "/v1/completions/derender", {
        "generate_responses": [gen], "prompt_tokens": [len(ids)], "prompt_token_ids": [ids]})
    assert r.status_code == 200, r.text
    cmpl = post(server, "/v1/completions",
                {"prompt": ids, "temperature": 0, "max_tokens": 16}).json()
    assert r.json()["choices"][0]["text"] == cmpl["choices"][0]["text"]
    assert r.json()["usage"] == cmpl["usage"]


@pytest.mark.parametrize("path,body,param", [
    ("/inference/v1/generate", {"token_ids": [-1], "sampling_params": {}}, "token_ids"),
    ("/inference/v1/generate", {"token_ids": [10 ** 7], "sampling_params": {}}, "prompt"),
    ("/inference/v1/generate", {"token_ids": [], "sampling_params": {}}, "token_ids"),
    ("/inference/v1/generate", {"token_ids": [1], "sampling_params": {"temperature": -1}},
     "sampling_params.temperature"),
    ("/inference/v1/generate", {"token_ids": [1], "sampling_params": {"bad_words": ["x"]}},
     "sampling_params.bad_words"),
    ("/inference/v1/generate", {"token_ids": [1], "sampling_params": {},
                                "output_mode": "derender", "stream": True}, "output_mode"),
    ("/v1/chat/completions/render", {"messages": []}, "messages"),
    ("/v1/completions/derender", {"generate_responses": []}, "generate_responses"),
    ("/v1/chat/completions/derender", {"stream": True, "generate_response": {
        "request_id": "r", "choices": [{"index": 0, "token_ids": [1]}]}}, "stream"),
    ("/v1/chat/completions/derender", {"generate_response": {
        "request_id": "r", "choices": [{"index": 0, "token_ids": [10 ** 7]}]}}, "token_ids"),
])
def test_bad_input_is_a_400_and_the_server_keeps_serving(server, path, body, param):
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
    assert generate(server, [1, 2, 3], sampling_params={"max_tokens": 2}).status_code == 200


def test_tokens_only_refuses_what_needs_text():
    srv = ServerProcess("--tokens-only").wait_ready()
    try:
        r = generate(srv.url, [1, 2, 3], sampling_params={"stop": ["x"]})
        assert r.status_code == 400 and "--tokens-only" in r.json()["error"]["message"]
        r = generate(srv.url, [1, 2, 3], output_mode="text")
        assert r.status_code == 400 and r.json()["error"]["param"] == "output_mode"
        assert generate(srv.url, [1, 2, 3]).status_code == 200
        assert post(srv.url, "/abort_requests", {"request_ids": ["x"]}).status_code == 200
    finally:
        assert srv.stop() == 0
