"""The operator routes through the real server: dev mode (pause, resume, abort, sleep and
wake, prefix cache, weight updates, server info, collective_rpc) and the profiler, with
vLLM's bodies, behind the API key, and absent without their flags."""

from __future__ import annotations

import gzip
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from server_helpers import ServerProcess, metric

MODEL = "SmolLM2-135M-Instruct"
KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "The capital of France is"
KV_CACHE_BYTES = 256 * 2**20  # server_helpers.BASE_ARGS' --kv-cache-memory
# Every operator route: (method, path). None may exist without its flag, and each needs the key.
OPERATOR_ROUTES = [
    ("POST", "/pause"), ("POST", "/resume"), ("GET", "/is_paused"),
    ("POST", "/abort_requests"), ("POST", "/reset_prefix_cache"), ("POST", "/sleep"),
    ("POST", "/wake_up"), ("GET", "/is_sleeping"), ("POST", "/update_weights"),
    ("GET", "/weight_info"), ("GET", "/server_info"), ("POST", "/collective_rpc"),
    ("POST", "/init_weight_transfer_engine"), ("POST", "/start_weight_update"),
    ("POST", "/finish_weight_update"), ("POST", "/update_weight_version"),
    ("GET", "/get_world_size"), ("POST", "/shutdown_weight_transfer_engine"),
    ("POST", "/start_profile"), ("POST", "/stop_profile"), ("POST", "/reset_mm_cache"),
    ("POST", "/reset_encoder_cache"), ("POST", "/release_kv_cache_memory"),
]


@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("profiles")


@pytest.fixture(scope="module")
def server(profile_dir):
    config = {"profiler": "torch", "torch_profiler_dir": str(profile_dir),
              "torch_profiler_with_stack": False}
    proc = ServerProcess("--enable-dev-endpoints", "--api-key", KEY,
                         "--profiler-config", json.dumps(config),
                         "--no-batch-invariant").wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def plain(plain_server):
    return plain_server.url


@pytest.fixture()
def c(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as client:
        yield client
    # Every test leaves the engine serving.
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as client:
        assert client.post("/resume").json() == {"status": "resumed"}
        if client.get("/is_sleeping").json()["is_sleeping"]:
            assert client.post("/wake_up").status_code == 200


def complete(c: httpx.Client, prompt: str = PROMPT, **kw) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0, **kw}
    return c.post("/v1/completions", json=body)


def greedy(c: httpx.Client, prompt: str = PROMPT) -> tuple[str, list[float]]:
    r = complete(c, prompt, logprobs=1)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["text"], choice["logprobs"]["token_logprobs"]


def in_new_client(server: ServerProcess, call):
    """`call` on a client of its own (for a request made from another thread)."""
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as client:
        return call(client)


def rss(server: ServerProcess) -> int:
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@dataclass
class Stream:
    """A streamed completion read in a thread: its chunks and how it ended."""

    started: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    chunks: list[dict] = field(default_factory=list)
    finish_reason: str | None = None
    saw_done: bool = False
    status: int | None = None
    error: BaseException | None = None


def start_stream(url: str, max_tokens: int = 400, request_id: str | None = None) -> Stream:
    s = Stream()
    headers = {**AUTH, **({"X-Request-Id": request_id} if request_id else {})}

    def run() -> None:
        try:
            with httpx.stream("POST", url + "/v1/completions", headers=headers, timeout=120,
                              json={"model": MODEL, "prompt": "Count upward: one, two,",
                                    "max_tokens": max_tokens, "temperature": 0,
                                    "ignore_eos": True, "stream": True}) as r:
                s.status = r.status_code
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        s.saw_done = True
                    elif line.startswith("data: "):
                        chunk = json.loads(line[6:])
                        s.chunks.append(chunk)
                        s.started.set()
                        reason = chunk["choices"][0].get("finish_reason")
                        if reason:
                            s.finish_reason = reason
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            s.error = exc
        finally:
            s.started.set()
            s.done.set()

    threading.Thread(target=run, daemon=True).start()
    assert s.started.wait(60), "the stream did not start"
    return s


def assert_refused_while_paused(c: httpx.Client) -> None:
    r = complete(c)
    assert r.status_code == 503, r.text
    assert r.json()["error"] == {"message": "Generation is paused. Please retry after it "
                                            "resumes.", "type": "ServiceUnavailableError",
                                 "param": None, "code": 503}


# -- presence and auth --------------------------------------------------------------------

def test_operator_routes_absent_without_flags(plain):
    for method, path in OPERATOR_ROUTES:
        r = httpx.request(method, plain + path, json={})
        assert r.status_code == 404, (path, r.status_code)
    assert httpx.get(plain + "/docs").status_code == 200  # the plain operation list stays


def test_every_operator_route_needs_the_key(server):
    for method, path in OPERATOR_ROUTES:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = httpx.request(method, server.url + path, headers=headers, json={})
            assert r.status_code == 401, (path, headers)
            assert r.json()["error"]["code"] == 401
    r = httpx.get(server.url + "/is_paused", headers=AUTH)
    assert r.status_code == 200 and r.json() == {"is_paused": False}


# -- pause, resume, abort -----------------------------------------------------------------

def test_pause_resume_state_and_idempotency(c):
    assert c.get("/is_paused").json() == {"is_paused": False}
    for mode in ("abort", "wait", "keep"):
        for _ in range(2):
            r = c.post("/pause", params={"mode": mode})
            assert r.status_code == 200 and r.json() == {"status": "paused"}
            assert c.get("/is_paused").json() == {"is_paused": True}
        for _ in range(2):
            assert c.post("/resume").json() == {"status": "resumed"}
        assert c.get("/is_paused").json() == {"is_paused": False}


@pytest.mark.parametrize("query, param", [({"mode": "invalid"}, "query.mode"),
                                          ({"clear_cache": "maybe"}, "query.clear_cache")])
def test_pause_refuses_bad_query_and_keeps_state(c, query, param):
    for paused in (False, True):
        if paused:
            assert c.post("/pause").status_code == 200
        r = c.post("/pause", params=query)
        assert r.status_code == 400
        assert r.json()["error"]["param"] == param
        assert c.get("/is_paused").json() == {"is_paused": paused}
        c.post("/resume")
    assert complete(c).status_code == 200  # canary


def test_pause_abort_ends_streams_cleanly_and_refuses_new(server, c):
    stream = start_stream(server.url)
    assert c.post("/pause", params={"mode": "abort"}).json() == {"status": "paused"}
    assert stream.done.wait(30), "the aborted stream hung"
    assert stream.error is None and stream.status == 200
    assert stream.finish_reason == "abort" and stream.saw_done
    assert_refused_while_paused(c)
    assert c.post("/resume").json() == {"status": "resumed"}
    assert complete(c).status_code == 200


def test_pause_wait_drains_then_refuses(server, c):
    stream = start_stream(server.url, max_tokens=24)
    assert c.post("/pause", params={"mode": "wait"}).json() == {"status": "paused"}
    # The reply came once the in-flight request had finished on its own (its last chunk
    # may still be on its way to the client).
    assert stream.done.wait(2)
    assert stream.finish_reason == "length" and stream.saw_done
    assert_refused_while_paused(c)
    c.post("/resume")
    assert complete(c).status_code == 200


def _settled_length(stream, quiet: float = 0.5, limit: float = 10.0) -> int:
    """The stream's chunk count once no chunk has arrived for `quiet` seconds."""
    deadline = time.monotonic() + limit
    seen = len(stream.chunks)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = len(stream.chunks)
        if now == seen:
            return now
        seen = now
    raise AssertionError(f"the stream kept growing for {limit} s after the pause")


def test_pause_keep_freezes_and_queues(server, c):
    stream = start_stream(server.url, max_tokens=60)
    assert c.post("/pause", params={"mode": "keep"}).json() == {"status": "paused"}
    # The step that ran before the pause took effect may still be on its way to the client
    # (detokenizer, HTTP, the reader thread): the stream settles, then must stay frozen.
    frozen_at = _settled_length(stream)
    queued: dict = {}
    waiter = threading.Thread(target=lambda: queued.update(r=in_new_client(server,
                                                                           complete)))
    waiter.start()
    time.sleep(2)
    assert not stream.done.is_set() and len(stream.chunks) == frozen_at
    assert "r" not in queued, "a new request ran while paused in keep mode"
    assert c.post("/resume").json() == {"status": "resumed"}
    waiter.join(60)
    assert stream.done.wait(60) and stream.finish_reason == "length"
    assert queued["r"].status_code == 200


def test_abort_requests_by_id_and_all(server, c):
    ours = start_stream(server.url, request_id="op-abort-1")
    other = start_stream(server.url, max_tokens=40)
    r = c.post("/abort_requests", json={"request_ids": ["cmpl-op-abort-1"]})
    assert r.status_code == 200 and r.json() == {"status": "aborted", "aborted": 1}
    assert ours.done.wait(30) and ours.finish_reason == "abort" and ours.saw_done
    assert other.done.wait(60) and other.finish_reason == "length"
    # No ids: every in-flight request.
    streams = [start_stream(server.url), start_stream(server.url)]
    r = c.post("/abort_requests", json={})
    assert r.json() == {"status": "aborted", "aborted": 2}
    for s in streams:
        assert s.done.wait(30) and s.finish_reason == "abort"
    assert c.post("/abort_requests", json={"request_ids": "x"}).status_code == 400
    assert c.post("/abort_requests").status_code == 400  # a JSON object, as vLLM
    assert complete(c).status_code == 200


# -- caches, sleep ------------------------------------------------------------------------

def _prefix_hits(server: ServerProcess) -> float:
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    value = metric(text, "vllm:prefix_cache_hits_total", model_name=MODEL)
    assert value is not None
    return value


def test_reset_prefix_cache(server, c):
    prompt = "Paris is the capital of France. Berlin is the capital of Germany. " * 6
    complete(c, prompt, max_tokens=1)
    before = _prefix_hits(server)
    complete(c, prompt, max_tokens=1)
    assert _prefix_hits(server) > before  # cached
    r = c.post("/reset_prefix_cache")
    assert r.status_code == 200 and r.json() == {"success": True}
    before = _prefix_hits(server)
    complete(c, prompt, max_tokens=1)
    assert _prefix_hits(server) == before  # recomputed
    assert c.post("/reset_prefix_cache", params={"reset_external": "true"}).status_code == 400


@pytest.mark.parametrize("query, param", [("level=3", "query.level"),
                                          ("level=-1", "query.level"),
                                          ("level=x", "query.level"),
                                          ("mode=invalid", "query.mode")])
def test_sleep_refuses_bad_query(c, query, param):
    r = c.post(f"/sleep?{query}")
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert c.get("/is_sleeping").json() == {"is_sleeping": False}


def test_sleep_level_1_frees_kv_and_queues_requests(server, c):
    baseline = greedy(c)
    before = rss(server)
    r = c.post("/sleep", params={"level": 1})
    assert r.status_code == 200 and r.json() == {"status": "sleeping", "level": 1}
    asleep = rss(server)
    print(f"sleep level 1: RSS {before / 2**20:.1f} -> {asleep / 2**20:.1f} MiB")
    # The KV cache (zero-filled at start, so resident) is given back whole.
    assert before - asleep > 0.95 * KV_CACHE_BYTES
    assert c.get("/is_sleeping").json() == {"is_sleeping": True}
    # A request made while asleep waits, and is served after the wake-up.
    queued: dict = {}
    waiter = threading.Thread(target=lambda: queued.update(r=in_new_client(server, greedy)))
    waiter.start()
    time.sleep(1.5)
    assert "r" not in queued
    r = c.post("/wake_up")
    assert r.status_code == 200 and r.json() == {"status": "awake", "tags": None}
    waiter.join(60)
    assert queued["r"] == baseline
    assert c.get("/is_sleeping").json() == {"is_sleeping": False}
    assert greedy(c) == baseline


def test_sleep_level_2_drops_weights_and_reloads(server, c):
    baseline = greedy(c)
    version = c.get("/weight_info").json()["weight_version"]
    before = rss(server)
    assert c.post("/sleep", params={"level": 2}).json() == {"status": "sleeping", "level": 2}
    asleep = rss(server)
    print(f"sleep level 2: RSS {before / 2**20:.1f} -> {asleep / 2**20:.1f} MiB")
    assert before - asleep > KV_CACHE_BYTES + 150 * 2**20  # and the ~270 MB of weights
    # Waking only the KV cache leaves it asleep, as vLLM's tags do.
    r = c.post("/wake_up", params={"tags": "kv_cache"})
    assert r.json() == {"status": "sleeping", "tags": ["kv_cache"]}
    assert c.post("/wake_up", params={"tags": "bogus"}).status_code == 400
    assert c.post("/wake_up").json() == {"status": "awake", "tags": None}
    print(f"after wake: RSS {rss(server) / 2**20:.1f} MiB")
    assert greedy(c) == baseline  # the checkpoint's weights, read from disk again
    assert c.get("/weight_info").json()["weight_version"] == version  # vLLM's label stays


def test_sleep_keep_with_running_requests_is_refused(server, c):
    stream = start_stream(server.url, max_tokens=60)
    r = c.post("/sleep", params={"level": 1, "mode": "keep"})
    assert r.status_code == 409 and "mode=keep" in r.json()["error"]["message"]
    assert stream.done.wait(60) and stream.finish_reason == "length"


# -- weights --------------------------------------------------------------------------------

LAYER = "model.layers.29.mlp.down_proj.weight"


def _checkpoint_tensor(name: str):
    from actors.loader import prepare_model_dir
    from actors.loader.hf import safetensors_files
    from safetensors import safe_open

    for f in safetensors_files(prepare_model_dir(None)[1]):
        with safe_open(str(f), framework="pt") as st:
            if name in st.keys():
                return st.get_tensor(name)
    raise KeyError(name)


def update(c: httpx.Client, path: Path, version: str | None = None) -> httpx.Response:
    """One weight update from a path: start, update, finish (unless the update failed)."""
    assert c.post("/start_weight_update").json() == {"message": "Weight update started"}
    r = c.post("/update_weights", json={"update_info": {"path": str(path)}})
    if r.status_code == 200:
        assert r.json() == {"message": "Weights updated"}
        assert c.post("/finish_weight_update",
                      json={"weight_version": version}).status_code == 200
    return r


def test_update_weights_changes_the_next_request(c, tmp_path):
    """The default model is a Q4_1 GGUF served quantized: the changed matrix is packed from
    the update's values, the others stay in their blocks."""
    from safetensors.torch import save_file

    original = _checkpoint_tensor(LAYER)
    base_text, base_lps = greedy(c)
    version = c.get("/weight_info").json()["weight_version"]

    changed = tmp_path / "changed.safetensors"
    save_file({LAYER: (original.float() * 3.0).to(original.dtype).contiguous()}, str(changed))
    assert update(c, changed, "x3").status_code == 200
    assert c.get("/weight_info").json() == {"weight_version": "x3"}
    new_lps = greedy(c)[1]
    assert max(abs(a - b) for a, b in zip(new_lps, base_lps)) > 1e-3
    # The prompt's KV from before the update was not reused: a fresh run agrees.
    c.post("/reset_prefix_cache")
    assert greedy(c)[1] == new_lps

    # Refusals leave the weights as they are.
    wrong_shape = tmp_path / "shape.safetensors"
    save_file({LAYER: original[:, :10].contiguous()}, str(wrong_shape))
    wrong_name = tmp_path / "name.safetensors"
    save_file({"model.layers.99.mlp.down_proj.weight": original}, str(wrong_name))
    not_st = tmp_path / "junk.safetensors"
    not_st.write_bytes(b"not a safetensors file")
    for path, words in [(wrong_shape, "has shape"), (wrong_name, "is not a weight"),
                        (tmp_path / "missing.safetensors", "does not exist"),
                        (not_st, "not a safetensors file")]:
        r = update(c, path)
        assert r.status_code == 400, (path, r.text)
        assert words in r.json()["error"]["message"]
    for body in ({}, {"update_info": "x"}):
        r = c.post("/update_weights", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "update_info"
    assert c.get("/weight_info").json() == {"weight_version": "x3"}
    assert greedy(c)[1] == new_lps

    # The original tensor back: the original output back.
    restore = tmp_path / "restore.safetensors"
    save_file({LAYER: original.contiguous()}, str(restore))
    assert update(c, restore, version).status_code == 200
    assert greedy(c) == (base_text, base_lps)


# -- info, rpc, profiler ------------------------------------------------------------------

def test_server_info(c):
    info = c.get("/server_info").json()
    assert info["config"]["engine"]["max_model_len"] == 1024
    assert "api_keys" not in info["config"] and KEY not in json.dumps(info)
    assert info["system"]["rss_bytes"] > 0
    assert isinstance(c.get("/server_info", params={"config_format": "text"}).json()["config"],
                      str)
    # The linear routing chosen at load (this server gives up batch invariance, so linear
    # routing applies): each of the default model's five matrix shapes (qkv, o, gate/up,
    # down, the tied embedding as LM head) at every M bucket.
    table = info["linear_routing"]
    assert info["config"]["engine"]["linear_routing"] is True
    assert info["config"]["engine"]["batch_invariant"] is False
    # elapsed_s is 0 where nothing is raced (bf16 on a CPU without native bf16)
    assert table["buckets"] == [1, 8, 64, 256] and table["elapsed_s"] >= 0
    shapes = {(r["n"], r["k"]) for r in table["routes"]}
    assert shapes == {(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)}, shapes
    assert len(table["routes"]) == 20
    # The default model keeps its GGUF blocks (--quantization auto): each quantized matrix
    # races its own kernel against a bf16 copy, on the core's bf16 kernel (core_bf16) or,
    # where torch's bf16 GEMM is faster on the shape, on torch.
    from actors.loader.dtype import resolve_quantization

    quant = resolve_quantization("auto", None, "auto")
    assert info["config"]["engine"]["quantization"] == quant
    kernels = {r["kernel"] for r in table["routes"]}
    assert kernels <= ({"core", "core_bf16", "torch"} if quant == "gguf" else {"core", "torch"})


def test_collective_rpc_allow_list(c):
    r = c.post("/collective_rpc", json={"method": "execute_model", "args": ["x"]})
    assert r.status_code == 403
    assert "not allowed" in r.json()["error"]["message"]
    assert c.post("/collective_rpc", json={}).json()["error"]["param"] == "method"
    r = c.post("/collective_rpc", json={"method": "is_paused"})
    assert r.status_code == 200 and r.json() == {"results": [False]}
    assert complete(c).status_code == 200


def test_profiler_writes_traces_with_core_timers(c, profile_dir):
    r = c.post("/start_profile")
    assert r.status_code == 200 and r.content == b""
    r = c.post("/start_profile")
    assert r.status_code == 409 and "already active" in r.json()["error"]["message"]
    assert complete(c, max_tokens=4).status_code == 200
    assert c.post("/stop_profile").status_code == 200
    assert c.post("/stop_profile").status_code == 409
    traces = list(profile_dir.glob("engine_*.pt.trace.json.gz"))
    timers = list(profile_dir.glob("engine_*_core_timers.json"))
    assert len(traces) == 1 and len(timers) == 1
    events = json.loads(gzip.decompress(traces[0].read_bytes()))["traceEvents"]
    names = {e.get("name") for e in events}
    assert "llmcore.linear" in names and "llmcore.paged_attention" in names
    calls = json.loads(timers[0].read_text())["calls"]
    assert calls["llmcore.linear"]["calls"] > 0 and calls["llmcore.sample"]["calls"] >= 4
    # A prefix names the session's files; overrides we cannot honour are refused by name.
    for bad in (0, -1, 10**9, "3", True):
        r = c.post("/start_profile", json={"max_iterations": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_iterations", bad
    assert c.post("/start_profile", json={"delay_iterations": 3}).json()["error"]["param"] \
        == "delay_iterations"
    # A bounded session stops by itself at its bound and writes its trace then;
    # /stop_profile afterwards reports those files once.
    assert c.post("/start_profile", json={"max_iterations": 3,
                                          "profile_prefix": "bounded"}).status_code == 200
    assert complete(c, max_tokens=8).status_code == 200
    assert list(profile_dir.glob("bounded_engine_*_core_timers.json"))
    steps = json.loads(next(profile_dir.glob("bounded_engine_*_core_timers.json"))
                       .read_text())["calls"]["llmcore.sample"]["calls"]
    assert steps <= 3
    assert c.post("/stop_profile").status_code == 200
    assert c.post("/stop_profile").status_code == 409
    assert c.post("/start_profile", json={"profile_prefix": "../x"}).status_code == 400
    assert c.post("/start_profile", json={"profile_prefix": "run-1"}).status_code == 200
    assert c.post("/stop_profile").status_code == 200
    assert list(profile_dir.glob("run-1_engine_*_core_timers.json"))


# -- flags ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ['{"torch_profiler_dir": "/tmp/p"}',  # vLLM: needs profiler
                                  '{"profiler": "cuda", "torch_profiler_dir": "/tmp/p"}',
                                  '{"profiler": "torch"}', '{"profiler": "torch", '
                                  '"torch_profiler_dir": "/tmp/p", "bogus": 1}',
                                  '{"profiler": "torch", "torch_profiler_dir": "/tmp/p", '
                                  '"torch_profiler_use_gzip": "yes"}',
                                  '{"profiler": "torch", "torch_profiler_dir": "/tmp/p", '
                                  '"max_iterations": -1}',
                                  '{"profiler": "torch", "torch_profiler_dir": "/tmp/p", '
                                  '"max_profile_bytes": "1g"}', "[]", "not json"])
def test_bad_profiler_config_is_a_startup_error(text, capsys):
    from server.cli import parse_args

    with pytest.raises(SystemExit) as exc:
        parse_args(["--profiler-config", text])
    assert exc.value.code == 2 and "--profiler-config" in capsys.readouterr().err


def test_dev_mode_flag_and_environment(monkeypatch):
    from server.cli import parse_args

    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    assert not parse_args([]).enable_dev_endpoints
    assert parse_args(["--enable-dev-endpoints"]).enable_dev_endpoints
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    assert parse_args([]).enable_dev_endpoints
    cfg = parse_args(["--profiler-config",
                      '{"profiler": "torch", "torch_profiler_dir": "~/traces"}'])
    assert cfg.profiler_config["torch_profiler_dir"].endswith("/traces")
    assert not cfg.profiler_config["torch_profiler_dir"].startswith("~")
