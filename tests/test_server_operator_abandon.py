"""Operator calls abandoned by their client: a client that gives up on /pause, /sleep,
/update_weights, a LoRA load or the profiler (a proxy timeout, curl -m, a closed tab) must
not take the server down. Each route is called with a 50 ms client timeout while a stream
runs; the stream finishes, and /health and a greedy canary are unchanged afterwards.

Also here: the order of operations when a drain-mode pause or sleep is overtaken by /resume
or /wake_up (the later command wins), and an abandoned LoRA load leaves no slot behind."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import ServerProcess

MODEL = "SmolLM2-135M-Instruct"
KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
CANARY = "The capital of France is"
ABANDON_AFTER_S = 0.05


@pytest.fixture(scope="module")
def adapter_dir(default_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hf_reference import gguf_reference
    from lora_helpers import make_adapter

    d = tmp_path_factory.mktemp("abandon-lora")
    make_adapter(gguf_reference(default_model_path), d, seed=3, rank=4, alpha=8,
                 targets=["q_proj", "v_proj"])
    return d


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, adapter_dir: Path):
    profiles = tmp_path_factory.mktemp("abandon-profiles")
    config = {"profiler": "torch", "torch_profiler_dir": str(profiles),
              "torch_profiler_with_stack": False}
    proc = ServerProcess("--enable-dev-endpoints", "--api-key", KEY,
                         "--profiler-config", json.dumps(config),
                         "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
                         env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"}).wait_ready()
    yield proc
    proc.stop()


@pytest.fixture()
def c(server: ServerProcess):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as client:
        yield client


def canary(c: httpx.Client) -> str:
    r = c.post("/v1/completions", json={"model": MODEL, "prompt": CANARY, "max_tokens": 8,
                                        "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def stream_while(server: ServerProcess, call: Any, max_tokens: int = 200) -> dict[str, Any]:
    """Runs `call()` once a streamed completion has produced tokens; returns how the stream
    ended (status, finish_reason, chunks, error) after reading it to the end."""
    out: dict[str, Any] = {"chunks": 0, "finish_reason": None, "error": None, "done": False}
    body = {"model": MODEL, "prompt": "Count upward: one, two,", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    try:
        with httpx.stream("POST", server.url + "/v1/completions", headers=AUTH, json=body,
                          timeout=120) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    out["done"] = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    out["chunks"] += 1
                    if out["chunks"] == 3:
                        call()
                    if "error" in chunk:
                        out["error"] = chunk["error"]
                    elif chunk["choices"][0].get("finish_reason"):
                        out["finish_reason"] = chunk["choices"][0]["finish_reason"]
    except httpx.HTTPError as exc:
        out["error"] = repr(exc)
    return out


def abandon(server: ServerProcess, method: str, path: str, body: dict | None = None) -> bool:
    """Sends one request and gives up after ABANDON_AFTER_S; True if it was abandoned."""
    try:
        httpx.request(method, server.url + path, headers=AUTH, json=body,
                      timeout=ABANDON_AFTER_S)
    except httpx.TimeoutException:
        return True
    return False


def wait_until(c: httpx.Client, path: str, key: str, value: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = c.get(path)
        if r.status_code == 200 and r.json()[key] == value:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never showed {key}={value!r}")


def assert_serving(server: ServerProcess, c: httpx.Client, expected: str) -> None:
    assert server.proc.poll() is None, server.log()
    assert c.get("/health").status_code == 200, server.log()
    assert canary(c) == expected, server.log()


def update_file(tmp: Path) -> Path:
    """A one-tensor update equal to the checkpoint's own (the outputs stay the same)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from actors.loader import prepare_model_dir
    from actors.loader.hf import safetensors_files

    name = "model.layers.0.mlp.down_proj.weight"
    for f in safetensors_files(prepare_model_dir(None)[1]):
        with safe_open(str(f), framework="pt") as st:
            if name in st.keys():
                path = tmp / "same.safetensors"
                save_file({name: st.get_tensor(name).contiguous()}, str(path))
                return path
    raise KeyError(name)


def test_abandoned_operator_calls_leave_the_server_serving(server, c, adapter_dir, tmp_path):
    expected = canary(c)
    same = update_file(tmp_path)
    # (method, path, body, how to undo it once applied: a route to call and the state to
    # wait for first)
    cases: list[tuple[str, str, dict | None, Any]] = [
        ("POST", "/pause?mode=wait", None, ("/is_paused", "is_paused", True, "/resume")),
        ("GET", "/is_paused", None, None),
        ("POST", "/reset_prefix_cache", None, None),
        ("POST", "/sleep?mode=wait&level=1", None,
         ("/is_sleeping", "is_sleeping", True, "/wake_up")),
        # one weight update, each of its calls given up on (each still applies, in order)
        ("POST", "/start_weight_update", None, None),
        ("POST", "/update_weights", {"update_info": {"path": str(same)}}, None),
        ("POST", "/finish_weight_update", None, None),
        ("POST", "/v1/load_lora_adapter", {"lora_name": "late", "lora_path": str(adapter_dir)},
         None),
        ("POST", "/v1/unload_lora_adapter", {"lora_name": "late"}, None),
        ("POST", "/start_profile", None, None),
        ("POST", "/stop_profile", None, None),
        ("GET", "/is_sleeping", None, None),
        ("GET", "/weight_info", None, None),
        ("POST", "/collective_rpc", {"method": "reset_prefix_cache"}, None),
    ]
    report = []
    for method, path, body, undo in cases:
        abandoned: list[bool] = []
        ended = stream_while(server, lambda: abandoned.append(abandon(server, method, path,
                                                                      body)))
        assert ended["status"] == 200 and ended["error"] is None, (path, ended, server.log())
        assert ended["finish_reason"] == "length" and ended["done"], (path, ended)
        if undo is not None:
            state_path, key, value, undo_path = undo
            wait_until(c, state_path, key, value)
            assert c.post(undo_path).status_code == 200
        assert_serving(server, c, expected)
        report.append((path, "abandoned" if abandoned and abandoned[0] else "answered"))
    print("operator calls:", report)
    # The calls that wait for a drain, a thread or a disk read were given up on for sure.
    given_up = {p for p, how in report if how == "abandoned"}
    assert {"/pause?mode=wait", "/sleep?mode=wait&level=1"} <= given_up, report
    # The abandoned load either took effect and is registered, or left nothing behind: the
    # two slots still take two adapters.
    models = {m["id"] for m in c.get("/v1/models").json()["data"]}
    for name in ("late", "a1", "a2"):
        if name in models:
            assert c.post("/v1/unload_lora_adapter", json={"lora_name": name}).status_code == 200
    for name in ("a1", "a2"):
        r = c.post("/v1/load_lora_adapter", json={"lora_name": name,
                                                  "lora_path": str(adapter_dir)})
        assert r.status_code == 200, r.text
    assert_serving(server, c, expected)


@pytest.mark.parametrize("first, then, state", [
    ("/pause?mode=wait", "/resume", "is_paused"),
    ("/sleep?mode=wait&level=1", "/wake_up", "is_sleeping"),
])
def test_a_later_command_overtakes_a_draining_one(server, c, first, then, state):
    """pause (sleep) of mode wait is pending while a stream drains; resume (wake_up) comes
    first: the engine must end up running, not paused (asleep) with nobody to undo it."""
    expected = canary(c)
    seen: dict[str, Any] = {}

    def overtake() -> None:
        seen["abandoned"] = abandon(server, "POST", first)
        seen["then"] = c.post(then).status_code

    ended = stream_while(server, overtake)
    assert ended["finish_reason"] == "length" and ended["error"] is None, ended
    assert seen == {"abandoned": True, "then": 200}
    time.sleep(0.3)  # the drain has ended: a pause (sleep) applied late would show now
    assert c.get(f"/{state}").json() == {state: False}
    assert_serving(server, c, expected)
