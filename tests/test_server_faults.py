"""Failures on a real `python -m server` (fault points: actors/runtime/faults.py).

    bad_row     the core refuses one running request's sampling row at run time: that stream
                gets an error event, the streams beside it finish with the offline engine's
                text, and the server goes on serving
    engine,     an exception out of an actor: every in-flight request gets an error (a stream
    tokenizer,  an error event then [DONE], a plain request a 500 envelope), /health turns
    metrics     503 and the process exits with 1
"""

from __future__ import annotations

import signal
import threading
import time

import httpx
import orjson
import pytest

from server_helpers import ServerProcess, default_tokenizer, metric, offline_greedy

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
ENVELOPE = {"message", "type", "param", "code"}


def ids_of(text: str) -> list[int]:
    return default_tokenizer()(text, add_special_tokens=False)["input_ids"]


def stream_events(url: str, body: dict, out: dict) -> None:
    """Reads one streaming completion; records its events and when each arrived."""
    events: list[tuple[float, dict | str]] = []
    with httpx.Client(base_url=url, timeout=120) as c, c.stream(
            "POST", "/v1/completions", json=dict(body, stream=True)) as r:
        out["status"] = r.status_code
        for line in r.iter_lines():  # one at a time: sse_data() would read them all first
            if not line.startswith("data: "):
                continue
            data = line[6:]
            events.append((time.monotonic(), data if data == "[DONE]" else orjson.loads(data)))
            if "first" not in out:
                out["first"] = time.monotonic()
                first = out.get("on_first")
                if first is not None:
                    first.set()
    out["events"] = events


def text_of(events: list) -> str:
    return "".join(e["choices"][0]["text"] for _, e in events
                   if isinstance(e, dict) and e.get("choices"))


def post_plain(url: str, body: dict, out: dict) -> None:
    r = httpx.post(url + "/v1/completions", timeout=120, json=body)
    out["status"], out["body"], out["end"] = r.status_code, r.json(), time.monotonic()


def generated(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return metric(text, "vllm:generation_tokens_total", model_name=MODEL) or 0.0


@pytest.mark.parametrize("victim_streams", [True, False], ids=["stream", "plain"])
def test_a_row_the_core_refuses_fails_only_its_request(victim_streams: bool):
    # From engine step 20 on, once two sequences decode, the oldest row is spoiled: the
    # victim's, admitted first.
    srv = ServerProcess(env={"LLMSERVE_FAULT_INJECT": "bad_row:20"}).wait_ready()
    try:
        victim: dict = {"on_first": threading.Event()}
        # Continuations the model is sure of, so that a batch's rounding (rows computed
        # together rather than alone) cannot flip a near-tie against the offline run.
        prompts = [ids_of(t) for t in (", ".join(str(i) for i in range(1, 30)) + ",",
                                       ", ".join(["Monday", "Tuesday", "Wednesday", "Thursday",
                                                  "Friday", "Saturday", "Sunday"] * 3) + ",",
                                       "A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, P,")]
        others = [{} for _ in prompts]
        greedy = {"temperature": 0, "ignore_eos": True}
        t_victim = threading.Thread(target=stream_events if victim_streams else post_plain,
                                    args=(srv.url, dict(greedy, max_tokens=300, prompt=ids_of(
                                        "Write a long story about a dragon.")), victim))
        t_victim.start()
        if victim_streams:
            assert victim["on_first"].wait(60)
        else:
            deadline = time.monotonic() + 60
            while not generated(srv.url) and time.monotonic() < deadline:
                time.sleep(0.01)
        threads = [threading.Thread(target=stream_events, args=(
            srv.url, dict(greedy, prompt=p, max_tokens=60), out)) for p, out in zip(prompts,
                                                                                  others)]
        for t in threads:
            t.start()
        plain = httpx.post(srv.url + "/v1/completions", timeout=120,
                           json=dict(greedy, prompt=prompts[0], max_tokens=60))
        for t in (t_victim, *threads):
            t.join(120)
        if victim_streams:
            # Some tokens, then one error event with the envelope, then [DONE].
            events = victim["events"]
            assert events[-1][1] == "[DONE]"
            failed_at, last = events[-2]
            assert set(last["error"]) == ENVELOPE and last["error"]["code"] == 500
            assert all("error" not in e for _, e in events[:-2])
            assert text_of(events[:-2])
        else:  # a 500 with the envelope
            assert victim["status"] == 500, victim["body"]
            err = victim["body"]["error"]
            assert set(err) == ENVELOPE and err["type"] == "InternalServerError"
            failed_at = victim["end"]
        # At least one of the others shared steps with it (started before it failed), all
        # ended after it and produced exactly what the offline engine produces.
        assert any(out["first"] < failed_at for out in others)
        for p, out in zip(prompts, others):
            assert out["status"] == 200 and out["events"][-1][1] == "[DONE]"
            assert failed_at < out["events"][-1][0]
            assert not any("error" in e for _, e in out["events"][:-1])
            assert text_of(out["events"][:-1]) == offline_greedy(p, 60)[1]
        assert plain.status_code == 200
        assert plain.json()["choices"][0]["text"] == offline_greedy(prompts[0], 60)[1]
        # The server goes on: healthy, the canary answers, the error is counted once.
        assert httpx.get(srv.url + "/health").status_code == 200
        canary = httpx.post(srv.url + "/v1/completions", timeout=60,
                            json=dict(greedy, prompt=prompts[1], max_tokens=8))
        assert canary.json()["choices"][0]["text"] == offline_greedy(prompts[1], 8)[1]
        text = httpx.get(srv.url + "/metrics").text
        assert metric(text, "vllm:request_success_total", model_name=MODEL,
                      finished_reason="error") == 1.0
        assert metric(text, "vllm:num_requests_running", model_name=MODEL) == 0.0
        assert srv.stop() == 0
    finally:
        srv.stop(signal.SIGKILL)


@pytest.mark.parametrize("point", ["engine:30", "tokenizer:30", "metrics:40"])
def test_an_actor_exception_fails_in_flight_requests_and_exits_1(point: str):
    srv = ServerProcess(env={"LLMSERVE_FAULT_INJECT": point}).wait_ready()
    try:
        streamed: dict = {"on_first": threading.Event()}
        body = {"prompt": "Write a poem about the sea.", "max_tokens": 400, "ignore_eos": True}
        t_stream = threading.Thread(target=stream_events, args=(srv.url, body, streamed))
        t_stream.start()
        assert streamed["on_first"].wait(60)
        plain = httpx.post(srv.url + "/v1/completions", timeout=60, json=body)
        t_stream.join(60)
        health = httpx.get(srv.url + "/health").status_code
        events = [e for _, e in streamed["events"]]
        assert events[-1] == "[DONE]"
        assert set(events[-2]["error"]) == ENVELOPE and events[-2]["error"]["code"] == 500
        assert "injected" not in events[-2]["error"]["message"].lower()
        assert plain.status_code == 500 and set(plain.json()["error"]) == ENVELOPE
        assert health == 503
        assert srv.wait(30) == 1
        log = srv.log()
        assert f"the {point.split(':')[0]} actor failed" in log
    finally:
        srv.stop(signal.SIGKILL)
