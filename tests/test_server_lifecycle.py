"""`python -m server` start, admission, drain and failure, on the real default model.

    loading       /health is 503 until the model is ready, then 200
    admission     more requests than --max-num-seqs + --max-queued-requests: 503 + Retry-After
    SIGTERM       in-flight streams finish, new requests get 503, exit code 0
    engine fault  LLMSERVE_FAULT_AFTER_STEPS makes a step raise: every in-flight request gets
                  an error, /health turns 503, exit code 1
"""

from __future__ import annotations

import signal
import socket
import threading
import time

import httpx
import orjson
import pytest

from server_helpers import ServerProcess, metric, sse_data

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"

STREAM = {"prompt": "Write a poem about the sea.", "max_tokens": 16, "ignore_eos": True,
          "stream": True, "stream_options": {"include_usage": True}}


@pytest.fixture(scope="module")
def small_server():
    """Room for 2 running + 2 queued sequences; the SIGTERM test (last) stops it."""
    srv = ServerProcess("--max-num-seqs", "2", "--max-queued-requests", "2",
                        "--drain-timeout", "120").wait_ready()
    yield srv
    srv.stop()


def test_health_is_503_while_loading(small_server):
    codes = small_server.health_codes
    assert codes[-1] == 200 and 503 in codes and set(codes) == {503, 200}


def test_admission_full_gets_503(small_server):
    results: list[httpx.Response] = []

    def one() -> None:
        results.append(httpx.post(small_server.url + "/v1/completions", timeout=120, json={
            "prompt": "Hi", "max_tokens": 8, "ignore_eos": True}))

    def rejections() -> float:
        return metric(httpx.get(small_server.url + "/metrics").text,
                      "vllm:admission_rejections_total", model_name=MODEL,
                      reason="max_num_queued_reqs")

    rejected_before = rejections()
    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [r for r in results if r.status_code == 200]
    full = [r for r in results if r.status_code == 503]
    assert len(ok) + len(full) == 8 and len(ok) >= 4 and full
    assert all(r.json()["usage"]["completion_tokens"] == 8 for r in ok)
    for r in full:
        assert r.headers["Retry-After"] and r.json()["error"]["code"] == 503
    assert rejections() - rejected_before == len(full)


def _idle(url: str) -> bool:
    text = httpx.get(url + "/metrics").text
    return (metric(text, "vllm:num_requests_running", model_name=MODEL) == 0
            and metric(text, "vllm:num_requests_waiting", model_name=MODEL) == 0)


def test_stalled_readers_do_not_hold_capacity(small_server):
    """Clients that stop reading their streams keep their own output buffered, but once the
    engine has finished their sequences the capacity is free for everyone else."""
    url, port = small_server.url, small_server.port
    body = orjson.dumps({"prompt": "Tell me a story.", "max_tokens": 150, "ignore_eos": True,
                         "stream": True, "logprobs": 20})  # ~1 KB per token: fills buffers
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    stalled = []
    try:
        for _ in range(4):  # --max-num-seqs 2 + --max-queued-requests 2: all of capacity
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", port))
            s.sendall(head + body)
            stalled.append(s)
        time.sleep(0.5)
        deadline = time.monotonic() + 60
        while not _idle(url):
            assert time.monotonic() < deadline, "the engine did not finish the stalled streams"
            time.sleep(0.2)
        r = httpx.post(url + "/v1/completions", timeout=60,
                       json={"prompt": "Hi", "max_tokens": 2, "ignore_eos": True})
        assert r.status_code == 200, r.text
        # The stalled clients still get their whole streams when they read again.
        s = stalled[0]
        s.settimeout(30)
        data = b""
        while b"data: [DONE]" not in data:
            piece = s.recv(1 << 16)
            assert piece, data[-300:]
            data += piece
        assert data.count(b'"finish_reason":"length"') == 1
    finally:
        for s in stalled:
            s.close()
    deadline = time.monotonic() + 10
    while httpx.get(url + "/load").json()["server_load"] != 0:
        assert time.monotonic() < deadline, "closed connections still count as load"
        time.sleep(0.1)


def test_sigterm_drains_streams_then_exits_0(small_server):
    url = small_server.url
    # Long enough that both streams are still running when the probes below arrive
    # (16 tokens finish in a quarter of a second).
    long = dict(STREAM, max_tokens=200)
    with httpx.Client(base_url=url, timeout=60) as c:
        streams = [c.stream("POST", "/v1/completions", json=long) for _ in range(2)]
        responses = [s.__enter__() for s in streams]
        lines = [r.iter_lines() for r in responses]
        firsts = [next(it) for it in lines]  # both streams are under way
        assert all(f.startswith("data: {") for f in firsts)
        small_server.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == 503
        assert httpx.get(url + "/health").status_code == 503
        for first, it, s in zip(firsts, lines, streams):
            data = sse_data([first, *it])
            s.__exit__(None, None, None)
            assert data[-1] == "[DONE]"
            chunks = [orjson.loads(d) for d in data[:-1]]
            assert [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"]][-1] \
                == "length"
            assert chunks[-1]["usage"]["completion_tokens"] == 200
    assert small_server.wait(120) == 0


def test_engine_failure_fails_in_flight_and_exits_1():
    srv = ServerProcess(env={"LLMSERVE_FAULT_AFTER_STEPS": "30"}).wait_ready()
    try:
        plain: list[httpx.Response] = []
        with httpx.Client(base_url=srv.url, timeout=60) as c, c.stream(
                "POST", "/v1/completions", json=dict(STREAM, max_tokens=300)) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            first = next(lines)
            worker = threading.Thread(target=lambda: plain.append(httpx.post(
                srv.url + "/v1/completions", timeout=60,
                json={"prompt": "Hi", "max_tokens": 300, "ignore_eos": True})))
            worker.start()
            data = sse_data([first, *lines])
            health = httpx.get(srv.url + "/health").status_code
            worker.join()
        # The stream had its headers: one error event, then [DONE].
        assert data[-1] == "[DONE]"
        err = orjson.loads(data[-2])["error"]
        assert err["code"] == 500 and "Injected" not in err["message"]
        assert all("error" not in orjson.loads(d) for d in data[:-2])
        # The non-streaming request: a 500 envelope.
        assert plain[0].status_code == 500
        assert set(plain[0].json()["error"]) == {"message", "type", "param", "code"}
        assert health == 503
        assert srv.wait(30) == 1
    finally:
        srv.stop(signal.SIGKILL)


def test_env_seconds_takes_only_positive_durations() -> None:
    """LLMSERVE_STALL_TIMEOUT and LLMSERVE_SSE_KEEPALIVE: 0 would make every stream spin on
    keep-alives, a negative or non-number value would fail every stream, so they are refused
    at startup with the variable's name."""
    from server.config import env_seconds

    assert env_seconds("X_SECONDS", 15.0, {}) == 15.0
    assert env_seconds("X_SECONDS", 15.0, {"X_SECONDS": " 0.5 "}) == 0.5
    for bad in ("0", "-1", "abc", "inf", "nan"):
        with pytest.raises(ValueError, match="X_SECONDS"):
            env_seconds("X_SECONDS", 15.0, {"X_SECONDS": bad})


def test_drain_timeout_aborts_what_is_left_then_exits_0():
    """SIGTERM closes submissions; a stream still running when --drain-timeout ends is
    aborted (finish_reason "abort", then [DONE]) and the actors stop by closure: exit 0."""
    srv = ServerProcess("--drain-timeout", "1").wait_ready()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as c, c.stream(
                "POST", "/v1/completions", json=dict(STREAM, max_tokens=900)) as r:
            lines = r.iter_lines()
            first = next(lines)
            signalled = time.monotonic()
            srv.send_signal(signal.SIGTERM)
            data = sse_data([first, *lines])
            ended = time.monotonic() - signalled
        assert data[-1] == "[DONE]"
        chunks = [orjson.loads(d) for d in data[:-1]]
        reasons = [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"]]
        assert reasons[-1] == "abort" and chunks[-1]["usage"]["completion_tokens"] < 900
        assert ended < 10, ended  # the drain timeout, not the 900 tokens
        assert srv.wait(30) == 0
        log = srv.log(None)
        assert "drain timeout: aborting 1 requests" in log
        assert "did not stop" not in log and "did not retire" not in log
    finally:
        srv.stop(signal.SIGKILL)
