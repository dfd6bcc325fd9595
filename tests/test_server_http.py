"""The HTTP surface over the toy engine: shapes, errors, auth, streaming, cancellation."""

from __future__ import annotations

from contextlib import aclosing
from functools import partial

import httpx
import orjson
import pytest
import trio

from server.config import ServerConfig
from server.supervisor import Supervisor
from server_helpers import SCRIPT, ToyEngine, default_tokenizer


@pytest.fixture
async def server(nursery):
    default_tokenizer()
    engine = ToyEngine()
    cfg = ServerConfig(port=0, served_model_names=["toy"], max_queued_requests=4)
    sup = Supervisor(cfg, engine_factory=lambda: engine)
    await nursery.start(sup.run)
    host, port = sup.bound[0].removeprefix("http://").rsplit(":", 1)
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=10) as client:
        yield sup, engine, client


async def test_completion_shape(server):
    sup, engine, client = server
    r = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["finish_reason"] == "length"
    assert SCRIPT.startswith(body["choices"][0]["text"]) and body["choices"][0]["text"]
    assert body["usage"]["completion_tokens"] == 5


async def test_stream_and_cleanup(server):
    sup, engine, client = server
    chunks = []
    async with client.stream("POST", "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True,
        "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                chunks.append(line[6:])
    assert chunks[-1] == "[DONE]"
    parsed = [orjson.loads(c) for c in chunks[:-1]]
    assert parsed[0]["choices"][0]["delta"]["role"] == "assistant"
    finishes = [c["choices"][0]["finish_reason"] for c in parsed if c["choices"]]
    assert finishes.count("length") == 1
    assert parsed[-1]["usage"]["completion_tokens"] == 8
    await trio.sleep(0.1)
    assert sup.srv.admission.in_use == 0 and len(sup.srv.registry) == 0


BAD_REQUESTS = [
    ("/v1/completions", {"prompt": ""}, 400),
    ("/v1/completions", {"prompt": []}, 400),
    ("/v1/completions", {"prompt": [""]}, 400),
    ("/v1/completions", {"prompt": [[]]}, 400),
    ("/v1/completions", {"prompt": [-1]}, 400),
    ("/v1/completions", {"prompt": [10**6]}, 400),
    ("/v1/completions", {"prompt": "x", "suffix": "y"}, 400),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400),
    ("/v1/completions", {"prompt": "x", "max_tokens": -3}, 400),
    ("/v1/completions", {"prompt": "x", "max_tokens": "ten"}, 400),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10**6}, 400),
    ("/v1/completions", {"prompt": "x", "temperature": -0.1}, 400),
    ("/v1/completions", {"prompt": "x", "temperature": 2.5}, 400),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}, 400),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, 400),
    ("/v1/completions", {"prompt": "x", "top_p": 1.5}, 400),
    ("/v1/completions", {"prompt": "x", "top_k": -2}, 400),
    ("/v1/completions", {"prompt": "x", "top_k": 1.5}, 400),
    ("/v1/completions", {"prompt": "x", "min_p": 1.5}, 400),
    ("/v1/completions", {"prompt": "x", "presence_penalty": 3}, 400),
    ("/v1/completions", {"prompt": "x", "frequency_penalty": -3}, 400),
    ("/v1/completions", {"prompt": "x", "repetition_penalty": 0}, 400),
    ("/v1/completions", {"prompt": "x", "n": 0}, 400),
    ("/v1/completions", {"prompt": "x", "n": 100000}, 400),
    ("/v1/completions", {"prompt": "x", "n": 2, "temperature": 0}, 400),
    ("/v1/completions", {"prompt": "x", "stop": [""]}, 400),
    ("/v1/completions", {"prompt": "x", "stop": ["a"] * 17}, 400),
    ("/v1/completions", {"prompt": "x", "stop": "z" * 300}, 400),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [-1]}, 400),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, 400),
    ("/v1/completions", {"prompt": "x", "logprobs": -5}, 400),
    ("/v1/completions", {"prompt": "x", "min_tokens": 10, "max_tokens": 5}, 400),
    ("/v1/completions", {"prompt": "x", "min_tokens": -1}, 400),
    ("/v1/completions", {"prompt": "x", "seed": 2**64}, 400),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"abc": 1}}, 400),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"999999": 1}}, 400),
    ("/v1/completions", {"prompt": "x", "stream": False,
                         "stream_options": {"include_usage": True}}, 400),
    ("/v1/completions", {"prompt": "x", "prompt_logprobs": 1, "stream": True}, 400),
    ("/v1/completions", {"prompt": "x", "model": "nope"}, 404),
    ("/v1/completions", {"prompt": "x " * 400}, 400),
    ("/v1/completions", {"prompt": ["a"] * 65}, 400),
    ("/v1/completions", {"prompt": 5}, 400),
    ("/v1/chat/completions", {"messages": []}, 400),
    ("/v1/chat/completions", {}, 400),
    ("/v1/chat/completions", {"messages": "hi"}, 400),
    ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "chat_template": "{{ 1 }}"}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "chat_template_kwargs": {"tokenize": True}}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "chat_template_kwargs": {"chat_template": "{{ 1 }}"}}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "add_generation_prompt": True,
                              "continue_final_message": True}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "top_logprobs": 3}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "logprobs": True, "top_logprobs": 50}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "max_completion_tokens": 0}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "tools": []}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "tool_choice": "auto"}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "model": "other"}, 404),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "response_format": {"type": "json_object"}}, 400),
    ("/tokenize", {}, 400),
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400),
    ("/detokenize", {"tokens": [-1]}, 400),
    ("/detokenize", {"tokens": "abc"}, 400),
    ("/invocations", {"foo": 1}, 400),
]


async def test_bad_requests_get_envelopes(server):
    sup, engine, client = server
    for path, body, status in BAD_REQUESTS:
        r = await client.post(path, json=body)
        assert r.status_code == status, (path, body, r.status_code, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
        assert "Traceback" not in err["message"] and "/work/" not in err["message"]
    raw_cases = [
        ("POST", "/v1/completions", b"{not json", 400),
        ("POST", "/v1/completions", b"[1, 2]", 400),
        ("POST", "/v1/completions", b'"text"', 400),
        ("GET", "/v1/completions", b"", 405),
        ("GET", "/no/such/route", b"", 404),
    ]
    for method, path, content, status in raw_cases:
        r = await client.request(method, path, content=content,
                                 headers={"Content-Type": "application/json"})
        assert r.status_code == status, (method, path, r.status_code, r.text[:200])
        assert r.json()["error"]["code"] == status
    async with httpx.AsyncClient(base_url=client.base_url, timeout=10) as fresh:
        r = await fresh.post("/v1/completions", content=b"x" * (5 * 1024 * 1024),
                             headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == 413
    assert len(BAD_REQUESTS) + len(raw_cases) + 1 >= 60
    # The canary: the server still answers, and nothing is left running.
    r = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3})
    assert r.status_code == 200
    await trio.sleep(0.05)
    assert sup.srv.admission.in_use == 0 and not engine.has_unfinished_requests()


async def test_stop_string_and_n(server):
    sup, engine, client = server
    r = await client.post("/v1/completions", json={
        "prompt": "Hi", "max_tokens": 20, "stop": ["quick"], "n": 2, "temperature": 1.0})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    for c in choices:
        assert "quick" not in c["text"]
    c0 = choices[0]
    assert c0["text"] == "Hello world! The " and c0["finish_reason"] == "stop"
    assert c0["stop_reason"] == "quick"
    await trio.sleep(0.05)
    assert not engine.has_unfinished_requests() and sup.srv.admission.in_use == 0


async def _post_then_leave(port: int, body: dict, *, read_first: bool, wait: float = 0) -> None:
    """A client that sends a request and closes its socket (after the first bytes, or wait)."""
    payload = orjson.dumps(body)
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(head + payload)
        if read_first:
            await stream.receive_some(4096)
        else:
            await trio.sleep(wait)


async def test_disconnect_aborts_and_frees(server):
    sup, engine, client = server
    engine._step_seconds = 0.02
    port = int(str(client.base_url).rsplit(":", 1)[1].strip("/"))
    async with trio.open_nursery() as n:
        for _ in range(4):
            n.start_soon(partial(_post_then_leave, port, {"prompt": "Hi", "max_tokens": 200,
                                                          "stream": True}, read_first=True))
        for _ in range(3):
            n.start_soon(partial(_post_then_leave, port, {"prompt": "Hi", "max_tokens": 200},
                                 read_first=False, wait=0.3))
    with trio.fail_after(2):
        while engine.has_unfinished_requests() or sup.srv.admission.in_use:
            await trio.sleep(0.02)
    text = (await client.get("/metrics")).text
    assert 'vllm:request_success_total{engine="0",finished_reason="abort",model_name="toy"} 7.0' in text
    assert 'vllm:num_requests_running{engine="0",model_name="toy"} 0.0' in text
    assert (await client.post("/v1/completions", json={"prompt": "Hi"})).status_code == 200


async def test_overload_gets_503(server):
    sup, engine, client = server
    engine._step_seconds = 0.05
    results = []

    async def one():
        r = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 5})
        results.append(r)

    async with trio.open_nursery() as n:
        for _ in range(20):  # capacity is 8 + 4
            n.start_soon(one)
    codes = sorted(r.status_code for r in results)
    assert codes.count(200) >= 12 and 503 in codes
    assert all(r.headers.get("Retry-After") for r in results if r.status_code == 503)


async def test_engine_failure_fails_requests(nursery):
    engine = ToyEngine(fail_after_steps=3)
    sup = Supervisor(ServerConfig(port=0), engine_factory=lambda: engine)
    await nursery.start(sup.run)
    host, port = sup.bound[0].removeprefix("http://").rsplit(":", 1)
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=10) as client:
        r = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 50})
        assert r.status_code == 500 and r.json()["error"]["code"] == 500
        assert "toy" not in r.json()["error"]["message"]
        assert (await client.get("/health")).status_code == 503
    assert sup.exit_code == 1
