"""Elastic data parallel (--enable-elastic-ep): POST /scale_elastic_ep adds and removes
engine cores while the server serves, POST /is_scaling_elastic_ep reports a scale in
progress.

Under load (concurrent streams through the openai SDK, running from before the first scale
to after the last) the server goes from one engine to two and back to one: no stream
fails, every one ends with its finish_reason and all its tokens, the second engine takes
requests once it has loaded, its own requests finish before it exits (its process is gone
after), its `engine`-labelled series leave /metrics and engine 0's gauges go back to 0.
The bad inputs get vLLM's errors: a missing, non-integer or non-positive size or drain
timeout, a body that is not JSON, a size above the bound (at most one engine a CPU), a
scale while one runs (503 and vLLM's body), a drain that outlasts its timeout (408: the
engine stays and its stream finishes), and a server started without the flag.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from server_helpers import ServerProcess, engine_children, metric
from subproc import child_env

pytestmark = pytest.mark.slow  # engine processes start and stop
if len(os.sched_getaffinity(0)) < 2:
    pytest.skip("the default bound is one engine a CPU: two engines need two CPUs",
                allow_module_level=True)

MODEL = "SmolLM2-135M-Instruct"
SCALING = {"error": "The model is currently scaling. Please try again later."}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess("--enable-elastic-ep", "--kv-cache-memory", "64m",
                         "--max-num-seqs", "8").wait_ready()
    try:
        yield proc
    finally:
        proc.stop()


def scale(server: ServerProcess, body: object, **kw: object) -> httpx.Response:
    return httpx.post(server.url + "/scale_elastic_ep", json=body, timeout=300, **kw)


def is_scaling(server: ServerProcess) -> bool:
    r = httpx.post(server.url + "/is_scaling_elastic_ep", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["is_scaling_elastic_ep"]


def engines_in_metrics(server: ServerProcess) -> set[str]:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return {line.split('engine="', 1)[1].split('"', 1)[0] for line in text.splitlines()
            if line.startswith("vllm:num_requests_running{")}


def gauge(server: ServerProcess, name: str, engine: str) -> float | None:
    return metric(httpx.get(server.url + "/metrics", timeout=10).text, name, engine=engine)


def wait_until(check, what: str, timeout: float = 120) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Load:
    """Streams through the openai SDK from `workers` threads until stopped; each stream's
    outcome: "ok" (finish_reason "length" and all max_tokens tokens), else what went wrong."""

    def __init__(self, server: ServerProcess, workers: int = 4, max_tokens: int = 24) -> None:
        self.client = openai.OpenAI(base_url=server.url + "/v1", api_key="none",
                                    max_retries=0, timeout=120)
        self.max_tokens = max_tokens
        self.outcomes: list[str] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers)
        self._futures = [self._pool.submit(self._loop, w) for w in range(workers)]

    def _loop(self, worker: int) -> None:
        i = 0
        while not self.stop.is_set():
            outcome = self._one(f"Worker {worker} item {i}:")
            with self._lock:
                self.outcomes.append(outcome)
            i += 1

    def _one(self, prompt: str) -> str:
        try:
            chunks = list(self.client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=self.max_tokens, temperature=0,
                extra_body={"ignore_eos": True}, stream=True,
                stream_options={"include_usage": True}))
        except openai.OpenAIError as exc:
            return f"{type(exc).__name__}: {exc}"
        finish = [c.choices[0].finish_reason for c in chunks if c.choices]
        usage = chunks[-1].usage
        if finish[-1:] != ["length"] or usage is None or usage.completion_tokens != self.max_tokens:
            return f"incomplete: finish {finish[-1:]}, usage {usage}"
        return "ok"

    def finish(self) -> list[str]:
        self.stop.set()
        for f in self._futures:
            f.result()
        self._pool.shutdown()
        self.client.close()
        return self.outcomes


def test_scale_up_and_down_under_load_loses_nothing(server: ServerProcess) -> None:
    assert engines_in_metrics(server) == {"0"} and len(engine_children(server.proc.pid)) == 1
    load = Load(server)
    seen_scaling: list[bool] = []
    try:
        wait_until(lambda: len(load.outcomes) >= 4, "the first streams")
        with ThreadPoolExecutor(1) as side:  # /is_scaling_elastic_ep while the scale runs
            watching = threading.Event()

            def watch() -> None:
                while not watching.is_set():
                    seen_scaling.append(is_scaling(server))
                    time.sleep(0.05)

            side.submit(watch)
            up = scale(server, {"new_data_parallel_size": 2})
            watching.set()
        assert up.status_code == 200, up.text
        assert up.json() == {"message": "Scaled to 2 data parallel engines"}
        assert True in seen_scaling and not is_scaling(server)
        assert engines_in_metrics(server) == {"0", "1"}
        assert len(engine_children(server.proc.pid)) == 2
        # The new engine takes its share, then is caught with requests of its own running.
        wait_until(lambda: _served(server, "1") >= 2, "engine 1 to serve")
        wait_until(lambda: (gauge(server, "vllm:num_requests_running", "1") or 0) > 0,
                   "a request running on engine 1")
        served_before = _served(server, "1")
        down = scale(server, {"new_data_parallel_size": 1, "drain_timeout": 60})
        assert down.status_code == 200, down.text
        assert down.json() == {"message": "Scaled to 1 data parallel engines"}
        done_after = len(load.outcomes)
        wait_until(lambda: len(load.outcomes) >= done_after + 4, "streams after the scale-down")
    finally:
        outcomes = load.finish()
    failures = [o for o in outcomes if o != "ok"]
    print(f"elastic: {len(outcomes)} streams, {len(failures)} failed; engine 1 had served "
          f"{served_before:.0f} when it was told to leave; is_scaling polls {len(seen_scaling)}")
    assert not failures, failures[:5]
    assert len(outcomes) >= 12
    # Engine 1 is gone: its series, its process; engine 0 idle again.
    assert engines_in_metrics(server) == {"0"}
    assert len(engine_children(server.proc.pid)) == 1
    wait_until(lambda: gauge(server, "vllm:num_requests_running", "0") == 0
               and gauge(server, "vllm:num_requests_waiting", "0") == 0, "engine 0 idle")
    assert httpx.get(server.url + "/load", timeout=10).json() == {"server_load": 0}
    assert not is_scaling(server)


def _served(server: ServerProcess, engine: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{") and f'engine="{engine}"' in line)


@pytest.mark.parametrize(("body", "message"), [
    ({}, "new_data_parallel_size is required"),
    ({"new_data_parallel_size": None}, "new_data_parallel_size is required"),
    ({"new_data_parallel_size": "2"}, "new_data_parallel_size must be a positive integer"),
    ({"new_data_parallel_size": 1.5}, "new_data_parallel_size must be a positive integer"),
    ({"new_data_parallel_size": True}, "new_data_parallel_size must be a positive integer"),
    ({"new_data_parallel_size": 0}, "new_data_parallel_size must be a positive integer"),
    ({"new_data_parallel_size": -1}, "new_data_parallel_size must be a positive integer"),
    ({"new_data_parallel_size": 1, "drain_timeout": 0}, "drain_timeout must be a positive integer"),
    ({"new_data_parallel_size": 1, "drain_timeout": "5"},
     "drain_timeout must be a positive integer"),
    ([2], "Invalid JSON format"),
])
def test_bad_bodies(server: ServerProcess, body: object, message: str) -> None:
    r = scale(server, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == message
    assert r.json()["error"]["code"] == 400


def test_not_json_and_above_the_bound(server: ServerProcess) -> None:
    r = httpx.post(server.url + "/scale_elastic_ep", content=b"{new_data", timeout=30,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "Invalid JSON format"
    r = httpx.post(server.url + "/scale_elastic_ep", content=b"new_data_parallel_size=2",
                   timeout=30, headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400, r.text
    cpus = len(os.sched_getaffinity(0))
    r = scale(server, {"new_data_parallel_size": cpus + 1})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert message.startswith(f"Cannot scale to data_parallel_size {cpus + 1}; "
                              "--elastic-ep-max-dp-size is "), message
    bound = int(message.rsplit(" ", 1)[1].rstrip("."))
    assert 1 <= bound <= cpus
    # the running size is answered without work, as vLLM skips it
    assert scale(server, {"new_data_parallel_size": 1}).json() == {
        "message": "Scaled to 1 data parallel engines"}
    assert engines_in_metrics(server) == {"0"}


def test_scale_while_scaling_and_a_drain_that_times_out(server: ServerProcess) -> None:
    with ThreadPoolExecutor(1) as side:
        up = side.submit(scale, server, {"new_data_parallel_size": 2})
        wait_until(lambda: is_scaling(server) or up.done(), "the scale to start")
        second = scale(server, {"new_data_parallel_size": 1})
        assert up.result().status_code == 200, up.result().text
    assert second.status_code == 503 and second.json() == SCALING
    # A stream on engine 1 that outlasts a 1 s drain: 408, engine 1 serves on, the stream
    # finishes; a second try once it has drains at once.
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as client, \
            ThreadPoolExecutor(2) as pool:
        streams = [pool.submit(lambda i=i: list(client.completions.create(
            model=MODEL, prompt=f"Long {i}:", max_tokens=160, extra_body={"ignore_eos": True},
            temperature=0, stream=True))) for i in range(2)]
        wait_until(lambda: (gauge(server, "vllm:num_requests_running", "1") or 0) > 0,
                   "a stream on engine 1")
        slow = scale(server, {"new_data_parallel_size": 1, "drain_timeout": 1})
        assert slow.status_code == 408, slow.text
        assert slow.json()["error"]["message"] == (
            "Scale failed due to request drain timeout after 1 seconds")
        assert engines_in_metrics(server) == {"0", "1"} and not is_scaling(server)
        for s in streams:
            assert s.result()[-1].choices[0].finish_reason == "length"
    assert scale(server, {"new_data_parallel_size": 1}).status_code == 200
    assert engines_in_metrics(server) == {"0"}
    assert len(engine_children(server.proc.pid)) == 1


def test_without_the_flag() -> None:
    done = subprocess.run([sys.executable, "-m", "server", "--elastic-ep-max-dp-size", "2"],
                          capture_output=True, text=True, env=child_env(), timeout=120,
                          check=False)
    assert done.returncode == 2 and "--elastic-ep-max-dp-size needs --enable-elastic-ep" \
        in done.stderr
    proc = ServerProcess("--kv-cache-memory", "64m").wait_ready()
    try:
        assert scale(proc, {"new_data_parallel_size": 1}).status_code == 200
        r = scale(proc, {"new_data_parallel_size": 2})
        assert r.status_code == 400
        assert r.json()["error"]["message"] == ("Elastic data parallel is not enabled: start "
                                                "the server with --enable-elastic-ep.")
        assert not is_scaling(proc)
    finally:
        proc.stop()
