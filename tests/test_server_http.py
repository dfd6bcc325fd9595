"""The HTTP surface of `python -m server` on the real default model: errors, cancellation.

One server for the module. After every bad request the server must be exactly as before:
nothing running, nothing waiting, no admission slot held, the canary's greedy text unchanged.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from functools import partial

import httpx
import orjson
import pytest
import trio

from server_helpers import ServerProcess, metric, offline_greedy

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
LEAKS = ("Traceback", "/work/", ".py", "site-packages", "Exception", "object at 0x")


# A client that stops reading is dropped after STALL seconds (instead of 60); streams that
# wait for a token longer than KEEPALIVE seconds get an SSE comment.
STALL, KEEPALIVE = 2, 0.02


@pytest.fixture(scope="module")
def server_proc():
    srv = ServerProcess(env={"LLMSERVE_STALL_TIMEOUT": str(STALL),
                             "LLMSERVE_SSE_KEEPALIVE": str(KEEPALIVE)}).wait_ready()
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def server(server_proc):
    return server_proc.url


def idle_state(url: str) -> dict[str, float | None]:
    text = httpx.get(url + "/metrics").text
    return {name: metric(text, name, model_name=MODEL) for name in
            ("vllm:num_requests_running", "vllm:num_requests_waiting",
             "vllm:kv_cache_usage_perc")} | {"load": httpx.get(url + "/load").json()["server_load"]}


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
    ("/v1/completions", {"prompt": "x " * 1100}, 400),
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
                              "tool_choice": "auto"}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "model": "other"}, 404),
    ("/tokenize", {}, 400),
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400),
    ("/detokenize", {"tokens": [-1]}, 400),
    ("/detokenize", {"tokens": "abc"}, 400),
    ("/invocations", {"foo": 1}, 400),
    # More wrong types and values, and 404s for unknown models on every model route.
    ("/v1/completions", {"prompt": "x", "stream": "maybe"}, 400),
    ("/v1/completions", {"prompt": "x", "seed": "abc"}, 400),
    ("/v1/completions", {"prompt": "x", "max_tokens": "ten"}, 400),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10.5}, 400),
    ("/v1/completions", {"prompt": "x", "logprobs": "1"}, 400),
    ("/v1/completions", {"prompt": "x", "temperature": "nan"}, 400),
    ("/v1/completions", {"prompt": "x", "seed": 2**63}, 400),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [10**7]}, 400),
    ("/v1/completions", {"prompt": "x", "prompt_logprobs": 21}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "prompt_logprobs": 1, "stream": True}, 400),
    ("/v1/completions", {"prompt": [[1, 2], [-4]]}, 400),
    ("/v1/completions", {"prompt": ["ok", ""]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": 5, "content": "hi"}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "top_logprobs": "2", "logprobs": True}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi " * 1100}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2,
                              "temperature": 0}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "stop": ["a"] * 17}, 400),
    ("/tokenize", {"prompt": "a", "model": "nope"}, 404),
    ("/detokenize", {"tokens": [1], "model": "nope"}, 404),
]

# Refused at the edge with the field named: these once reached the engine (which refused
# them with a generic message) or got a 503 that no retry could ever turn into a 200.
HI = [{"role": "user", "content": "hi"}]
BAD_PARAMS = [
    # With chat's max_tokens unset nothing is compared at the edge; min_tokens >=
    # max_model_len can never be met whatever the prompt.
    ("/v1/chat/completions", {"messages": HI, "min_tokens": 1024}, "min_tokens"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": None, "min_tokens": 5000},
     "min_tokens"),
    # On completions an explicit null is the default, 16.
    ("/v1/completions", {"prompt": "x", "max_tokens": None, "min_tokens": 17}, "min_tokens"),
    # 64 prompts x n=16 is more sequences than the server ever admits: 400, not 503.
    ("/v1/completions", {"prompt": ["a"] * 64, "n": 16, "temperature": 1}, "n"),
    # The field that is wrong is named, as vLLM names it.
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [1] * 257}, "stop_token_ids"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [10**7]}, "stop_token_ids"),
    # Any non-empty stream_options needs stream=true, even one that asks for nothing.
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": False}},
     "stream_options"),
    ("/v1/chat/completions", {"messages": HI, "stream": False,
                              "stream_options": {"continuous_usage_stats": False}},
     "stream_options"),
    ("/v1/completions", {"prompt": "x", "allowed_token_ids": []}, "allowed_token_ids"),
    ("/v1/completions", {"prompt": "x", "allowed_token_ids": [10**6]}, "allowed_token_ids"),
    ("/v1/chat/completions", {"messages": HI, "allowed_token_ids": [-1]}, "allowed_token_ids"),
    ("/v1/completions", {"prompt": "x", "truncate_prompt_tokens": 1025},
     "truncate_prompt_tokens"),
    ("/v1/completions", {"prompt": "x", "truncate_prompt_tokens": -2},
     "truncate_prompt_tokens"),
    ("/v1/completions", {"prompt": "x", "truncate_prompt_tokens": 0},
     "truncate_prompt_tokens"),
    ("/v1/completions", {"prompt": "x", "truncation_side": "middle"}, "truncation_side"),
    ("/v1/completions", {"prompt": "x", "best_of": 3, "temperature": 1}, "best_of"),
    # Not implemented yet: refused by name rather than silently ignored.
    ("/v1/completions", {"prompt": "x", "echo": True, "logprobs": 1, "stream": True}, "echo"),
    # Beam search: what vLLM refuses, the width bound, and what the engine's search lacks.
    ("/v1/completions", {"prompt": "x", "use_beam_search": True, "stream": True}, "stream"),
    ("/v1/completions", {"prompt": "x", "use_beam_search": True, "echo": True, "logprobs": 1},
     "echo"),
    ("/v1/chat/completions", {"messages": HI, "use_beam_search": True, "n": 17}, "n"),
    ("/v1/completions", {"prompt": "x", "use_beam_search": True, "length_penalty": "x"},
     "length_penalty"),
    ("/v1/chat/completions", {"messages": HI, "use_beam_search": True,
                              "allowed_token_ids": [5]}, "allowed_token_ids"),
    ("/v1/completions", {"prompt": "x", "use_beam_search": True,
                         "structured_outputs": {"regex": "a+"}}, "structured_outputs"),
    ("/v1/chat/completions", {"messages": HI, "response_format": {"type": "yaml"}},
     "response_format"),
    # Structured outputs that can never be satisfied (the rest is test_server_structured.py).
    ("/v1/chat/completions", {"messages": HI, "structured_outputs": {"choice": []}},
     "structured_outputs.choice"),
    ("/v1/completions", {"prompt": "x", "structured_outputs": {"regex": "a+", "choice": ["a"]}},
     "structured_outputs"),
    ("/v1/chat/completions", {"messages": HI, "bad_words": ["hello"]}, "bad_words"),
    ("/v1/completions", {"prompt": "x", "logprobs": 1, "logprob_token_ids": [10**6]},
     "logprob_token_ids"),
    ("/v1/chat/completions", {"messages": HI, "logprob_token_ids": [5]}, "logprob_token_ids"),
    ("/v1/chat/completions", {"messages": HI, "tool_choice": "required",
                              "tools": [{"type": "function", "function": {"name": "f"}}]},
     "tool_choice"),
    # tools without tool_choice mean "auto", which needs --enable-auto-tool-choice
    ("/v1/chat/completions", {"messages": HI,
                              "tools": [{"type": "function", "function": {"name": "f"}}]},
     "tool_choice"),
]



def check_envelope(r: httpx.Response, status: int) -> None:
    assert r.status_code == status, (r.request.url, r.status_code, r.text[:300])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
    assert not any(leak in err["message"] for leak in LEAKS), err["message"]


def test_bad_requests_then_canary(server):
    canary_ids = httpx.post(server + "/tokenize", json={
        "prompt": "The three primary colours are", "add_special_tokens": False}).json()["tokens"]
    _, known_text = offline_greedy(canary_ids, 10)
    before = idle_state(server)
    cases = 0
    with httpx.Client(base_url=server, timeout=30) as c:
        for path, body, status in BAD_REQUESTS:
            check_envelope(c.post(path, json=body), status)
            cases += 1
        for path, body, param in BAD_PARAMS:
            r = c.post(path, json=body)
            check_envelope(r, 400)
            assert r.json()["error"]["param"] == param, (body, r.text)
            assert "Retry-After" not in r.headers
            cases += 1
        raw_cases = [
            ("POST", "/v1/completions", b"{not json", 400),
            ("POST", "/v1/completions", b"[1, 2]", 400),
            ("POST", "/v1/completions", b'"text"', 400),
            ("POST", "/v1/chat/completions", b"", 400),
            ("GET", "/v1/completions", b"", 405),
            ("DELETE", "/v1/models", b"", 405),
            ("BREW", "/v1/models", b"", 405),
            ("GET", "/no/such/route", b"", 404),
        ]
        for method, path, content, status in raw_cases:
            check_envelope(c.request(method, path, content=content,
                                     headers={"Content-Type": "application/json"}), status)
            cases += 1
        check_envelope(c.post("/v1/completions", content=b"x" * (5 * 1024 * 1024),
                              headers={"Content-Type": "application/json"}), 413)
        # The same without a Content-Length (chunked): the limit holds while reading.
        chunks = (b"x" * (256 * 1024) for _ in range(24))
        check_envelope(c.post("/v1/completions", content=chunks,
                              headers={"Content-Type": "application/json"}), 413)
        # Not JSON: wrong media type, invalid UTF-8, a lone surrogate.
        check_envelope(c.post("/v1/completions", content=b'{"prompt": "x"}',
                              headers={"Content-Type": "text/plain"}), 400)
        for raw in (b'{"prompt": "\xff\xfe x"}', b'{"prompt": "\\ud800 x"}'):
            check_envelope(c.post("/v1/completions", content=raw,
                                  headers={"Content-Type": "application/json"}), 400)
        cases += 5
        # Validation comes before tokenizing: an over-long prompt with a bad field is
        # refused for the field, not for the prompt it never tokenized.
        r = c.post("/v1/completions", json={"prompt": "x " * 1100, "temperature": -1})
        check_envelope(r, 400)
        assert r.json()["error"]["param"] == "temperature"
        r = c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi " * 1100}], "top_p": 5,
            "chat_template": "{{ undefined_call() }}"})
        check_envelope(r, 400)
        assert r.json()["error"]["param"] == "top_p"
        cases += 2
    assert cases >= 60
    # The canary: the same greedy text as the offline engine, and nothing left running.
    r = httpx.post(server + "/v1/completions", json={"prompt": canary_ids, "max_tokens": 10,
                                                    "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == known_text
    assert idle_state(server) == before == {"vllm:num_requests_running": 0.0,
                                            "vllm:num_requests_waiting": 0.0,
                                            "vllm:kv_cache_usage_perc": before[
                                                "vllm:kv_cache_usage_perc"], "load": 0}


async def _stream_then_leave(port: int, body: dict, started: list[int]) -> None:
    """Sends a streaming request, reads until the first generated text arrives, hangs up."""
    payload = orjson.dumps(body)
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(head + payload)
        seen = b""
        while b'"text":"' not in seen.replace(b'"text":""', b""):
            data = await stream.receive_some(65536)
            assert data, "the server closed the stream early"
            seen += data
        started.append(1)


async def _post_then_time_out(port: int, body: dict, after: float, gave_up: list[int]) -> None:
    """A non-streaming client that gives up waiting after `after` seconds."""
    payload = orjson.dumps(body)
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(head + payload)
        with trio.move_on_after(after):
            data = await stream.receive_some(65536)
            raise AssertionError(f"answered before the timeout: {data[:200]!r}")
        gave_up.append(1)


async def test_disconnects_abort_and_free(server):
    before = await trio.to_thread.run_sync(idle_state, server)
    text = (await trio.to_thread.run_sync(httpx.get, server + "/metrics")).text
    aborts_before = metric(text, "vllm:request_success_total", model_name=MODEL,
                           finished_reason="abort")
    port = int(server.rsplit(":", 1)[1])
    body = {"prompt": "Tell me a long story.", "max_tokens": 600, "ignore_eos": True}
    started, gave_up = [], []
    async with trio.open_nursery() as n:
        for _ in range(20):
            n.start_soon(_stream_then_leave, port, dict(body, stream=True), started)
        for _ in range(5):
            n.start_soon(_post_then_time_out, port, body, 1.5, gave_up)
    assert len(started) == 20 and len(gave_up) == 5
    # Within 2 s of the last hang-up: nothing running or waiting, KV back to idle.
    with trio.fail_after(2):
        while True:
            now = await trio.to_thread.run_sync(idle_state, server)
            if now == before:
                break
            await trio.sleep(0.05)
    text = (await trio.to_thread.run_sync(httpx.get, server + "/metrics")).text
    aborts = metric(text, "vllm:request_success_total", model_name=MODEL, finished_reason="abort")
    assert aborts - aborts_before == 25
    r = await trio.to_thread.run_sync(partial(
        httpx.post, server + "/v1/completions", json={"prompt": "Hi", "max_tokens": 4},
        timeout=30))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


def test_metrics_names_and_labels(server):
    httpx.post(server + "/v1/completions", json={"prompt": "Hi", "max_tokens": 3,
                                                "ignore_eos": True})
    # Any token is a valid HTTP method; label values must come from a closed set all the same.
    for method in ("BREW", "X" * 40):
        assert httpx.request(method, server + "/v1/models").status_code == 405
    text = httpx.get(server + "/metrics").text
    assert "BREW" not in text and "X" * 40 not in text
    assert metric(text, "http_requests_total", handler="unmatched", method="other",
                  status="4xx") >= 2
    labels = {line.split("{", 1)[1].split("}", 1)[0] for line in text.splitlines()
              if line.startswith("http_requests_total{")}
    assert all(re.search(r'method="(GET|POST|OPTIONS|HEAD|other)"', lb) for lb in labels)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
        assert metric(text, name, model_name=MODEL) is not None, name
    for name in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                 "vllm:request_prompt_tokens", "vllm:request_generation_tokens"):
        assert metric(text, name + "_count", model_name=MODEL) >= 1, name
    assert metric(text, "vllm:request_success_total", model_name=MODEL,
                  finished_reason="length") >= 1
    assert metric(text, "http_requests_total", handler="/v1/completions", method="POST",
                  status="2xx") >= 1


def _labels_of(text: str, name: str) -> list[dict[str, str]]:
    return [dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', line.split("{", 1)[1]))
            for line in text.splitlines() if line.startswith(name + "{")]


def _wait_for_success(url: str, before: str, reason: str, n: int) -> str:
    """/metrics once `n` more sequences finished with `reason` (the metrics actor applies
    events asynchronously, so a response can arrive a moment before its metrics)."""
    want = metric(before, "vllm:request_success_total", model_name=MODEL,
                  finished_reason=reason) + n
    for _ in range(100):
        text = httpx.get(url + "/metrics").text
        if metric(text, "vllm:request_success_total", model_name=MODEL,
                  finished_reason=reason) >= want:
            return text
        time.sleep(0.05)
    raise AssertionError(f"{n} sequences did not finish with {reason!r}")


def test_metrics_vllm_invariants(server):
    """vLLM's own metric invariants after N completions of P prompt tokens and M tokens each
    (the same prompt, so the later ones hit the prefix cache), then one n=2 request."""
    n_req, p, m = 3, 40, 5
    prompt = list(range(3000, 3000 + p))  # ids no other test sends
    before = httpx.get(server + "/metrics").text
    for _ in range(n_req):
        r = httpx.post(server + "/v1/completions", timeout=60, json={
            "prompt": prompt, "max_tokens": m, "ignore_eos": True, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == m, r.text
    after = _wait_for_success(server, before, "length", n_req)

    def d(name: str, **labels: str) -> float:
        return metric(after, name, model_name=MODEL, **labels) - metric(
            before, name, model_name=MODEL, **labels)

    assert d("vllm:time_to_first_token_seconds_count") == n_req
    assert d("vllm:inter_token_latency_seconds_count") == n_req * (m - 1)
    assert d("vllm:request_prompt_tokens_sum") == n_req * p
    assert d("vllm:prompt_tokens_total") == n_req * p
    assert d("vllm:generation_tokens_total") == n_req * m
    assert d("vllm:iteration_tokens_total_sum") == n_req * (p + m)
    assert d("vllm:request_params_n_count") == d("vllm:request_params_n_sum") == n_req
    assert d("vllm:request_params_max_tokens_sum") == n_req * m
    assert d("vllm:request_max_num_generation_tokens_count") == n_req
    assert d("vllm:request_max_num_generation_tokens_sum") == n_req * m
    for name in ("vllm:request_time_per_output_token_seconds", "vllm:request_queue_time_seconds",
                 "vllm:request_inference_time_seconds", "vllm:request_prefill_time_seconds",
                 "vllm:request_decode_time_seconds", "vllm:request_num_preemptions",
                 "vllm:request_prefill_kv_computed_tokens"):
        assert d(name + "_count") == n_req, name
    assert d("vllm:request_num_preemptions_sum") == 0
    # Phases: inference = prefill + decode; per-sequence TPOT = decode / (M - 1).
    assert d("vllm:request_inference_time_seconds_sum") == pytest.approx(
        d("vllm:request_prefill_time_seconds_sum") + d("vllm:request_decode_time_seconds_sum"),
        abs=1e-6)
    assert d("vllm:request_time_per_output_token_seconds_sum") * (m - 1) == pytest.approx(
        d("vllm:request_decode_time_seconds_sum"), abs=1e-6)
    assert d("vllm:request_decode_time_seconds_sum") > 0
    # Prompt tokens by source: computed + cache hits = all; the repeats hit whole blocks.
    cached = d("vllm:prompt_tokens_cached_total")
    assert cached == d("vllm:prompt_tokens_by_source_total", source="local_cache_hit")
    assert cached >= (n_req - 1) * 16
    assert d("vllm:prompt_tokens_by_source_total", source="local_compute") + cached == n_req * p
    assert d("vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    assert d("vllm:request_prefill_kv_computed_tokens_sum") == n_req * p - cached
    # vLLM's buckets, exactly.
    les = {lb["le"] for lb in _labels_of(after, "vllm:iteration_tokens_total_bucket")}
    assert les == {f"{float(b)}" for b in (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
                                           8192, 16384)} | {"+Inf"}
    les = {lb["le"] for lb in _labels_of(after, "vllm:request_params_n_bucket")}
    assert les == {"1.0", "2.0", "5.0", "10.0", "20.0", "+Inf"}
    les = {lb["le"] for lb in _labels_of(after, "vllm:request_num_preemptions_bucket")}
    assert les == {"1.0", "2.0", "3.0", "4.0", "5.0", "10.0", "20.0", "+Inf"}
    # The cache config, as an info gauge.
    (info,) = _labels_of(after, "vllm:cache_config_info")
    assert metric(after, "vllm:cache_config_info", engine="0") == 1
    assert info["block_size"] == "16" and info["enable_prefix_caching"] == "True"
    assert info["cache_dtype"] == "auto" and info["engine"] == "0"
    assert int(info["kv_cache_size_tokens"]) == 16 * int(info["num_gpu_blocks"]) > 1024
    assert metric(after, "vllm:admission_rejections_total", model_name=MODEL,
                  reason="max_num_queued_reqs") == 0

    # n=2: one observation of n and of the longer of the two generations.
    before = after
    r = httpx.post(server + "/v1/completions", timeout=60, json={
        "prompt": "Hi", "max_tokens": 3, "ignore_eos": True, "n": 2})
    assert r.status_code == 200, r.text
    after = _wait_for_success(server, before, "length", 2)
    assert d("vllm:request_params_n_count") == 1 and d("vllm:request_params_n_sum") == 2
    assert d("vllm:request_max_num_generation_tokens_count") == 1
    assert d("vllm:request_max_num_generation_tokens_sum") == 3
    assert d("vllm:request_params_max_tokens_count") == 2


def test_context_boundary(server):
    """The exact edge of the context: max_model_len - 1 prompt tokens still get one token
    (finish_reason "length"), max_model_len tokens get a 400 with the real numbers; a
    max_tokens beyond the room left is clamped to it, not refused."""
    token = 1000
    with httpx.Client(base_url=server, timeout=120) as c:
        r = c.post("/v1/completions", json={"prompt": [token] * 1023, "max_tokens": None,
                                            "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"] == {"prompt_tokens": 1023, "completion_tokens": 1,
                                 "total_tokens": 1024, "prompt_tokens_details": None}
        assert body["choices"][0]["finish_reason"] == "length"
        r = c.post("/v1/completions", json={"prompt": [token] * 1020, "max_tokens": 100,
                                            "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        assert r.json()["choices"][0]["finish_reason"] == "length"
        r = c.post("/v1/completions", json={"prompt": [token] * 1024, "max_tokens": 1})
        check_envelope(r, 400)
        assert "1024" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "prompt"
        # Streamed, the refusal is still a real 400 (no SSE stream is started for it).
        r = c.post("/v1/completions", json={"prompt": [token] * 1024, "stream": True})
        check_envelope(r, 400)


def test_min_tokens_beyond_the_room_a_prompt_leaves(server):
    """min_tokens that the context cannot hold after this prompt: an up-front 400 naming
    min_tokens, streamed or not, with max_tokens unset or set (it is clamped to the room);
    one token less than the room still runs to exactly min_tokens."""
    prompt = [1000] * 1000  # leaves 24 of the 1024 positions
    before = idle_state(server)
    with httpx.Client(base_url=server, timeout=60) as c:
        for extra in ({"max_tokens": 1000}, {"max_tokens": 100}):
            for stream in (False, True):
                body = {"prompt": prompt, "min_tokens": 25, "stream": stream, **extra}
                r = c.post("/v1/completions", json=body)
                check_envelope(r, 400)
                assert r.headers["content-type"].startswith("application/json")
                err = r.json()["error"]
                assert err["param"] == "min_tokens" and err["type"] == "BadRequestError"
                assert "1000" in err["message"] and "24" in err["message"], err["message"]
        r = c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hello " * 1100}], "min_tokens": 1,
            "max_tokens": None, "stream": True})
        check_envelope(r, 400)  # the prompt itself is too long: that check comes first
        assert r.json()["error"]["param"] == "prompt"
        r = c.post("/v1/completions", json={"prompt": prompt, "min_tokens": 24,
                                            "max_tokens": 1000, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 24
        # An explicit null on completions is the default (16), as in vLLM.
        r = c.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": None,
                                            "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 16
    for _ in range(100):  # the gauges follow the engine a moment later
        if idle_state(server) == before:
            break
        time.sleep(0.05)
    assert idle_state(server) == before


def test_same_request_id_header_concurrently(server):
    """X-Request-Id is the client's: two requests sharing one must not share anything."""
    prompts = ["The three primary colours are", "My favourite season is"]
    want = [httpx.post(server + "/v1/completions", json={"prompt": p, "max_tokens": 12,
                                                       "temperature": 0}).json()
            ["choices"][0]["text"] for p in prompts]
    got: dict[int, httpx.Response] = {}

    def one(i: int) -> None:
        got[i] = httpx.post(server + "/v1/completions", timeout=60,
                            headers={"X-Request-Id": "same-id"},
                            json={"prompt": prompts[i], "max_tokens": 12, "temperature": 0})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        assert got[i].status_code == 200, got[i].text
        assert got[i].json()["id"] == "cmpl-same-id"
        assert got[i].json()["choices"][0]["text"] == want[i]


def test_stalled_reader_is_dropped(server_proc):
    """A client that stops reading its stream: once a send has been blocked for the stall
    timeout, its request is aborted (engine idle again, KV freed) and its connection reset;
    the server says so once in its log and keeps serving."""
    url = server_proc.url
    before = idle_state(url)
    text = httpx.get(url + "/metrics").text
    aborts = metric(text, "vllm:request_success_total", model_name=MODEL, finished_reason="abort")
    body = orjson.dumps({"prompt": "Tell me a long story.", "max_tokens": 1000,
                         "ignore_eos": True, "stream": True, "logprobs": 20})  # ~1 KB a token
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", server_proc.port))
        s.sendall(head + body)
        started = time.monotonic()
        while True:  # 1000 tokens take far longer than filling the buffers + the timeout
            text = httpx.get(url + "/metrics").text
            if metric(text, "vllm:request_success_total", model_name=MODEL,
                      finished_reason="abort") > aborts:
                break
            assert time.monotonic() - started < 60, "the stalled stream was not aborted"
            time.sleep(0.2)
        assert time.monotonic() - started >= STALL
        s.settimeout(10)
        got = b""
        try:
            while piece := s.recv(1 << 16):
                got += piece
        except ConnectionResetError:
            pass
        assert b"data: [DONE]" not in got and b"finish_reason\":\"length" not in got
    for _ in range(100):
        if idle_state(url) == before:
            break
        time.sleep(0.05)
    assert idle_state(url) == before
    assert server_proc.log().count("has not read for") == 1, server_proc.log()[-2000:]
    r = httpx.post(url + "/v1/completions", timeout=30, json={"prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200


def test_keepalive_comments_change_no_event(server):
    """With a keep-alive interval shorter than a decode step, comments arrive between the
    chunks; every data event is exactly what it would be without them."""
    # A fresh 600-token prompt (nothing cached): its prefill alone outlasts the interval.
    body = {"prompt": [2500] * 600, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    with httpx.stream("POST", server + "/v1/completions", timeout=60,
                      json=dict(body, stream=True)) as r:
        raw = r.read()
    want = httpx.post(server + "/v1/completions", timeout=60, json=body).json()
    events = [e for e in raw.split(b"\n\n") if e]
    comments = [e for e in events if e.startswith(b":")]
    assert comments and set(comments) == {b": ping"}
    data = [e for e in events if not e.startswith(b":")]
    assert all(e.startswith(b"data: ") and b"\n" not in e for e in data)
    assert data[-1] == b"data: [DONE]"
    chunks = [orjson.loads(e[6:]) for e in data[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == want["choices"][0]["text"]


def test_priority_needs_the_priority_policy(server):
    """Under the default fcfs policy a priority other than 0 is refused, as vLLM documents;
    0 (the default) is accepted."""
    for path, body in (("/v1/completions", {"prompt": "Hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
        for priority in (1, -1):
            r = httpx.post(server + path, timeout=30,
                           json={**body, "max_tokens": 1, "priority": priority})
            assert r.status_code == 400, r.text
            assert r.json()["error"] == {
                "message": f"Got priority {priority} but Priority scheduling is not enabled.",
                "type": "BadRequestError", "param": "priority", "code": 400}
        r = httpx.post(server + path, timeout=30, json={**body, "max_tokens": 1, "priority": 0})
        assert r.status_code == 200, r.text
