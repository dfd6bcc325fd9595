"""--data-parallel-size 2: two engine cores, each in its own process with its own KV cache,
behind one server. Both engines serve under concurrent load (each one's step counter and
finished count advance, under its own `engine` label), they give the same greedy tokens,
/metrics stays one valid exposition, /load counts both, and killing one engine's process
makes /health 503 and the server exit 1.

On this machine (2 cores) the two engines share the cores: this checks the arrangement,
not a speed-up.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from server_helpers import ServerProcess, engine_children, metric

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess("--data-parallel-size", "2", "--kv-cache-memory", "64m",
                         "--max-num-seqs", "8").wait_ready()
    try:
        yield proc
    finally:
        proc.stop()


def per_engine(server: ServerProcess, name: str, **labels: str) -> list[float]:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return [metric(text, name, engine=str(i), **labels) or 0.0 for i in range(2)]


def test_both_engines_serve_concurrent_requests(server: ServerProcess) -> None:
    steps_before = per_engine(server, "vllm:iteration_tokens_total_count")
    done_before = per_engine(server, "vllm:request_success_total", finished_reason="length")

    def one(i: int) -> str:
        r = httpx.post(server.url + "/v1/completions", timeout=120, json={
            "model": MODEL, "prompt": "The capital of France is", "max_tokens": 16,
            "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(one, i) for i in range(6)]
        deadline = time.monotonic() + 30
        loads = []
        while time.monotonic() < deadline and not all(f.done() for f in futures):
            loads.append(httpx.get(server.url + "/load").json()["server_load"])
            time.sleep(0.05)
        texts = [f.result() for f in futures]
    steps = [a - b for a, b in zip(per_engine(server, "vllm:iteration_tokens_total_count"),
                                   steps_before)]
    done = [a - b for a, b in zip(per_engine(server, "vllm:request_success_total",
                                             finished_reason="length"), done_before)]
    print(f"dp=2: finished per engine {done}, steps per engine {steps}, peak /load {max(loads)}")
    assert done == [3, 3]  # least-loaded placement splits six concurrent requests evenly
    assert all(s > 0 for s in steps)
    assert len(set(texts)) == 1  # the same greedy tokens from either engine
    assert max(loads) > 1


def test_metrics_is_one_exposition_with_an_engine_label(server: ServerProcess) -> None:
    text = httpx.get(server.url + "/metrics").text
    types = [line for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types))  # one TYPE line per family
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc"):
        assert [v is not None for v in (metric(text, name, engine="0"),
                                        metric(text, name, engine="1"))] == [True, True], name
    samples = [line.rsplit(" ", 1)[0] for line in text.splitlines()
               if line and not line.startswith("#")]
    assert len(samples) == len(set(samples))  # no series given twice


def test_constraints_compile_in_the_engines_and_a_refusal_is_the_same_400(
        server: ServerProcess) -> None:
    """With every engine in a child process, a constraint compiles there and constrains,
    and a spec the backend refuses is the 400 an in-process engine gives, naming its
    field."""
    pytest.importorskip("llguidance")
    from actors.core.structured import GrammarCache, StructuredSpec
    from actors.errors import RequestRefused
    from structured_helpers import _backend

    for _ in range(2):
        r = httpx.post(server.url + "/v1/completions", timeout=120, json={
            "model": MODEL, "prompt": "Answer:", "max_tokens": 12, "temperature": 0,
            "structured_outputs": {"regex": "[a-z]{3}-[0-9]{2}"}})
        assert r.status_code == 200, r.text
        assert re.fullmatch("[a-z]{3}-[0-9]{2}", r.json()["choices"][0]["text"])
    schema = {"type": "object", "properties": {"a": {"type": 7}}}
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "Hi", "max_tokens": 4,
        "structured_outputs": {"json": schema}})
    with pytest.raises(RequestRefused) as in_process:
        GrammarCache(_backend("guidance")).get(StructuredSpec.from_params(
            json=schema, source="structured_outputs"))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["message"], error["param"]) == (in_process.value.message,
                                                  in_process.value.param)


def test_a_dead_engine_fails_health_and_the_server_exits_1(server: ServerProcess) -> None:
    kids = engine_children(server.proc.pid)
    assert len(kids) == 2, kids
    os.kill(kids[1], signal.SIGKILL)
    r = httpx.post(server.url + "/v1/completions", timeout=30, json={
        "model": MODEL, "prompt": "Hello", "max_tokens": 4})
    codes = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and server.proc.poll() is None:
        try:
            codes.append(httpx.get(server.url + "/health", timeout=2).status_code)
        except httpx.TransportError:
            break
        if codes[-1] == 503:
            break
        time.sleep(0.1)
    assert server.wait(60) == 1, server.log()
    print(f"dead engine: request after the kill {r.status_code}, /health {codes[-3:]}")
    assert 503 in codes or r.status_code >= 500


def test_a_lora_load_refused_by_one_engine_is_undone_on_the_others() -> None:
    """All or none: engine 1 refuses a load that engines 0 and 2 applied; the front end
    registers no name for it, so 0 and 2 must unload it again (else their slots leak)."""
    import trio

    from actors.messages import Control, ControlResult
    from actors.runtime.data_parallel import DataParallelSystem

    class Engine:  # the part of an ActorSystem the fan-out uses
        def __init__(self, refuses: bool) -> None:
            self.refuses = refuses
            self.loaded: set[int] = set()

        async def control(self, command: Control) -> ControlResult:
            await trio.sleep(0.01)
            lora_id = int(dict(command.args)["lora_id"])
            if command.command == "load_lora_adapter":
                if self.refuses:
                    return ControlResult(False, error="no free slot", reason="conflict")
                self.loaded.add(lora_id)
            elif command.command == "unload_lora_adapter":
                self.loaded.discard(lora_id)
            return ControlResult(True)

    engines = [Engine(False), Engine(True), Engine(False)]
    dp = DataParallelSystem(engines, None, None, None, None)  # type: ignore[arg-type]

    async def main() -> tuple[ControlResult, ControlResult]:
        refused = await dp.control(Control("load_lora_adapter", (("lora_id", 7),)))
        engines[1].refuses = False
        loaded = await dp.control(Control("load_lora_adapter", (("lora_id", 8),)))
        return refused, loaded

    refused, loaded = trio.run(main)
    assert not refused.ok and refused.error == "no free slot"
    assert loaded.ok
    assert [e.loaded for e in engines] == [{8}, {8}, {8}]
