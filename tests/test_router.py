"""Two `python -m server` replicas behind vLLM's router (`vllm-router`), on loopback.

What a router needs from a replica, exercised through the router itself: round-robin
placement (counted from each replica's own /metrics), streaming through the
router with the openai SDK, X-Request-Id passed through and echoed, a replica killed with
SIGKILL mid-run (its streams end in an error, never a fake [DONE]; the other replica keeps
serving), and a rolling restart (SIGTERM drains one replica while a client keeps sending,
then it starts again on the same port) with no failed request for a client that retries a
503 or a refused connection the way a router's client does. The prefix-aware policies
(cache_aware, kv_aware) are in test_router_vllm_router.py.

Skipped, with the reason, when vllm-router is not installed (pip install vllm-router).
The replicas are small (BASE_ARGS, a 64 MiB KV cache) and every load is a few requests.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from server_helpers import BASE_ARGS, metric
from subproc import child_env

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
from replicas import Replica, Router, router_command  # noqa: E402

if router_command() is None:
    pytest.skip("vllm-router is not installed (pip install vllm-router)", allow_module_level=True)

REPLICA_ARGS = [*BASE_ARGS, "--kv-cache-memory", "64m", "--max-num-seqs", "8"]
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[Replica]]:
    reps = [Replica(REPLICA_ARGS).start() for _ in range(2)]
    try:
        for r in reps:
            r.wait_ready()
        yield reps
    finally:
        for r in reps:
            r.signal(signal.SIGTERM)
        for r in reps:
            r.wait(60)
            r.close()


def router_for(replicas: list[Replica], policy: str) -> Router:
    router = Router([r.url for r in replicas], policy)
    router.wait_ready()
    return router


def served(replica: Replica) -> float:
    """Requests this replica finished, by any reason (vllm:request_success_total summed)."""
    text = httpx.get(replica.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


def complete(url: str, prompt: str, max_tokens: int = 4, **extra: Any) -> httpx.Response:
    return httpx.post(url + "/v1/completions", timeout=60, headers=extra.pop("headers", None),
                      json={"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                            "temperature": 0, **extra})


def test_round_robin_alternates_and_echoes_request_ids(replicas: list[Replica]) -> None:
    router = router_for(replicas, "round_robin")
    try:
        before = [served(r) for r in replicas]
        for i in range(8):
            resp = complete(router.url, f"Say {i}.", headers={"X-Request-Id": f"rr-{i}"})
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-request-id"] == f"rr-{i}"
            assert resp.json()["id"] == f"cmpl-rr-{i}"
        per_replica = [served(r) - b for r, b in zip(replicas, before)]
        print(f"round_robin: requests per replica {per_replica}")
        assert per_replica == [4, 4]
    finally:
        router.close()


def test_streaming_through_the_router(replicas: list[Replica]) -> None:
    router = router_for(replicas, "round_robin")
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0)
    try:
        direct = complete(replicas[0].url, "Name a colour:", max_tokens=8).json()
        for _ in range(2):  # once on each replica
            stream = client.completions.create(model=MODEL, prompt="Name a colour:", max_tokens=8,
                                               temperature=0, stream=True,
                                               stream_options={"include_usage": True})
            chunks = list(stream)
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            assert text == direct["choices"][0]["text"]
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    finally:
        client.close()
        router.close()


def direct_stream(url: str, max_tokens: int, prompt: str = "Story:",
                  started: threading.Event | None = None) -> str:
    """One greedy stream of max_tokens tokens: "done" (ended with [DONE]), "cut" (ended
    without it), "status N", or the transport error's name. `started` is set once its first
    chunk arrived (the request is in the engine)."""
    try:
        with httpx.stream("POST", url + "/v1/completions", timeout=60, json={
                "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True}) as r:
            body = b""
            for chunk in r.iter_bytes():
                body += chunk
                if started is not None and r.status_code == 200:
                    started.set()
    except httpx.TransportError as exc:
        return type(exc).__name__
    if r.status_code != 200:
        return f"status {r.status_code}"
    return "done" if body.endswith(b"data: [DONE]\n\n") else "cut"


def wait_running(replica: Replica, timeout: float = 30) -> None:
    """Until the replica has a request in its running batch."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metric(httpx.get(replica.url + "/metrics").text, "vllm:num_requests_running"):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing running on {replica.url}")


class RetryingClient:
    """Sends completions through the router and retries what a router's client retries: a
    503 (the router found no healthy worker) and a refused or reset connection, up to
    `attempts` times with a short pause. Counts first-try errors and final failures."""

    def __init__(self, url: str, attempts: int = 5) -> None:
        self.url, self.attempts = url, attempts
        self.ok = self.failed = self.retried = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def send(self, i: int, stream: bool) -> None:
        last = ""
        for attempt in range(self.attempts):
            try:
                if stream:
                    with httpx.stream("POST", self.url + "/v1/completions", timeout=60, json={
                            "model": MODEL, "prompt": f"Item {i}:", "max_tokens": 6,
                            "temperature": 0, "stream": True}) as r:
                        body = r.read()
                        good = r.status_code == 200 and body.endswith(b"data: [DONE]\n\n")
                        status = r.status_code
                else:
                    r = complete(self.url, f"Item {i}:", max_tokens=6)
                    good, status, body = r.status_code == 200, r.status_code, r.content
                if good:
                    with self._lock:
                        self.ok += 1
                    return
                last = f"{status} {body[-200:]!r}"
                if status not in (502, 503):
                    break
            except httpx.TransportError as exc:
                last = repr(exc)
            with self._lock:
                self.retried += 1
            time.sleep(0.3 * (attempt + 1))
        with self._lock:
            self.failed += 1
            self.errors.append(last)


def test_drain_and_restart_loses_no_request(replicas: list[Replica]) -> None:
    router = router_for(replicas, "round_robin")
    client = RetryingClient(router.url)
    victim = replicas[0]
    stop = threading.Event()

    def traffic(worker: int) -> None:
        i = 0
        while not stop.is_set():
            client.send(worker * 10_000 + i, stream=i % 2 == 0)
            i += 1

    try:
        with ThreadPoolExecutor(4) as pool:
            for w in range(3):
                pool.submit(traffic, w)
            time.sleep(2)
            # One long stream straight on the victim, so that its drain has work to finish.
            started = threading.Event()
            in_flight = pool.submit(direct_stream, victim.url, 120, "Story:", started)
            assert started.wait(30), "the stream on the victim never started"
            victim.signal(signal.SIGTERM)
            deadline = time.monotonic() + 1
            codes = []
            while time.monotonic() < deadline:
                try:
                    codes.append(httpx.get(victim.url + "/health", timeout=1).status_code)
                except httpx.TransportError:
                    break
                time.sleep(0.05)
            drained_stream = in_flight.result()
            exit_code = victim.wait(60)
            victim.start()
            victim.wait_ready()
            served_again = served(victim)
            deadline = time.monotonic() + 30
            while served(victim) < served_again + 2 and time.monotonic() < deadline:
                time.sleep(0.5)
            back = served(victim) - served_again
            stop.set()
        print(f"drain/restart: ok {client.ok}, failed {client.failed}, retried {client.retried}, "
              f"in-flight stream {drained_stream}, health after SIGTERM {codes[:3]}, "
              f"drained exit {exit_code}, restarted replica served {back}")
        assert codes and codes[0] == 503, codes  # 503 at once, not after the drain
        assert drained_stream == "done"  # the request in flight at SIGTERM finished
        assert exit_code == 0, victim.log_tail()
        assert back >= 2  # the router sends to the restarted replica again
        assert client.failed == 0, client.errors
        assert client.ok > 10
    finally:
        stop.set()
        router.close()


def test_killed_replica_fails_its_streams_cleanly_and_the_other_serves(
        replicas: list[Replica]) -> None:
    router = router_for(replicas, "round_robin")
    victim, survivor = replicas
    outcomes: list[str] = []
    lock = threading.Lock()

    def long_stream(i: int) -> None:
        result = direct_stream(router.url, 200, f"Story {i}:")
        with lock:
            outcomes.append(result)

    try:
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(long_stream, i) for i in range(4)]
            wait_running(victim)
            victim.signal(signal.SIGKILL)
            killed_at = time.monotonic()
            after = [complete(router.url, f"After {i}:", max_tokens=4).status_code
                     for i in range(6)]
            for f in futures:
                f.result()
        print(f"kill: in-flight outcomes {sorted(outcomes)}, requests after the kill {after}, "
              f"{time.monotonic() - killed_at:.1f} s")
        assert victim.wait(10) == -signal.SIGKILL
        assert "done" in outcomes  # the survivor's streams finished
        assert any(o != "done" for o in outcomes)  # the victim's did not pretend to
        assert all(code == 200 for code in after), after  # retried onto the survivor
        assert complete(survivor.url, "Canary:").status_code == 200
    finally:
        router.close()
        victim.start()
        victim.wait_ready()


def test_replicas_script_brings_a_set_up_and_down() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "replicas.py"), "--replicas", "1", "--policy",
         "random", "--", *REPLICA_ARGS],
        capture_output=True, text=True, env=child_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    status = json.loads(done.stdout)
    assert status["ok"] and status["policy"] == "random"
    assert len(status["replicas"]) == 1 and status["router"].startswith("http://127.0.0.1:")
    assert "router ready" in done.stderr
