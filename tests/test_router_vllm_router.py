"""vLLM's router (`vllm-router`, PyPI) in its two prefix-aware modes over two replicas, on
loopback, with each placement read from the replicas' own /metrics.

- `cache_aware`: the router keeps an approximate tree of the text it sent to each worker
  and sends a request to the worker whose tree shares the longest prefix with it. The
  repeats of a long prefix stay on the replica that served it first, and that replica's
  prefix cache hits.
- `kv_aware`: the router subscribes to each replica's KV-cache events (`--kv-events-config`
  on the replica, `--kv-event-source URL=tcp://HOST:PORT` on the router), tokenizes every
  request through a replica's `/v1/completions/render` or `/v1/chat/completions/render`
  (`--enable-scale-out`), and sends it where the most of its leading blocks are cached. The
  test fills each replica's cache directly, one long prefix each, without the router: every
  later request with that prefix goes, through the router, to the replica that holds it
  (only the events can have told the router), and hits its cache there.

Skipped, with the reason, when vllm-router is not installed (pip install vllm-router).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import openai
import pytest
import zmq

from server_helpers import BASE_ARGS, metric

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from replicas import Replica, Router, router_command  # noqa: E402

if router_command() is None:
    pytest.skip("vllm-router is not installed (pip install vllm-router)", allow_module_level=True)

pytestmark = pytest.mark.slow  # two replicas and a router per module

REPLICA_ARGS = [*BASE_ARGS, "--kv-cache-memory", "64m", "--max-num-seqs", "8"]
MODEL = "SmolLM2-135M-Instruct"
BLOCK = 16


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[Replica]]:
    """Two replicas that publish KV events and serve the render routes (both modes use
    them; cache_aware ignores the events)."""
    reps = [Replica(REPLICA_ARGS, kv_events=True).start() for _ in range(2)]
    try:
        for r in reps:
            r.wait_ready()
        yield reps
    finally:
        for r in reps:
            r.stop()
            r.close()


def scrape(replica: Replica) -> str:
    return httpx.get(replica.url + "/metrics", timeout=10).text


def served(replica: Replica) -> float:
    """Requests this replica finished, by any reason (vllm:request_success_total summed)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in scrape(replica).splitlines()
               if line.startswith("vllm:request_success_total{"))


def hits(replica: Replica) -> float:
    return metric(scrape(replica), "vllm:prefix_cache_hits_total") or 0.0


def complete(url: str, prompt: str, max_tokens: int = 2) -> dict[str, Any]:
    r = httpx.post(url + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def prefix(name: str) -> str:
    """About 130 tokens shared by every request of one name: eight full KV blocks."""
    return f"You are the {name} assistant. " + f"{name} facts follow. " * 30


def placed(replicas: list[Replica], send: Any) -> int:
    """Which replica finished the one request `send()` makes (from their counters)."""
    before = [served(r) for r in replicas]
    send()
    delta = [served(r) - b for r, b in zip(replicas, before)]
    assert sorted(delta) == [0, 1], delta
    return delta.index(1)


def test_cache_aware_keeps_a_prefix_on_one_replica(replicas: list[Replica]) -> None:
    router = Router([r.url for r in replicas], "cache_aware")
    names = ("harbour", "orchard")
    try:
        router.wait_ready()
        where: dict[str, list[int]] = {name: [] for name in names}
        hits_before = [hits(r) for r in replicas]
        for turn in range(4):
            for name in names:
                where[name].append(placed(replicas, lambda n=name, t=turn: complete(
                    router.url, prefix(n) + f"Question {t}:")))
        print(f"cache_aware: replica of each request by prefix {where}")
        for name, seq in where.items():
            assert len(set(seq)) == 1, f"{name} moved between replicas: {seq}"
        gained = [hits(r) - h for r, h in zip(replicas, hits_before)]
        for name, seq in where.items():  # the repeats found their KV where the router sent them
            assert gained[seq[0]] >= 3 * 7 * BLOCK, (name, gained)
    finally:
        router.close()


def subscribe(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def wait_stored(sock: zmq.Socket, tokens: int, timeout: float = 30) -> None:
    """Until this subscriber has read BlockStored events for `tokens` token ids: the replica
    published the blocks, to the router's subscriber as well as to this one."""
    seen = 0
    deadline = time.monotonic() + timeout
    while seen < tokens:
        left = deadline - time.monotonic()
        assert left > 0, f"only {seen} of {tokens} tokens published"
        if sock.poll(int(left * 1000)):
            _topic, _seq, payload = sock.recv_multipart()
            _ts, events, _rank = msgpack.unpackb(payload)
            seen += sum(len(e["token_ids"]) for e in events if e["type"] == "BlockStored")


def drain(sock: zmq.Socket) -> None:
    while sock.poll(0):
        sock.recv_multipart()


def test_kv_aware_sends_a_prefix_where_its_kv_is(replicas: list[Replica]) -> None:
    sources = {r.url: r.kv_events_endpoint for r in replicas}
    router = Router([r.url for r in replicas], "kv_aware", kv_sources=sources, kv_model=MODEL)
    subs = [subscribe(r.kv_events_endpoint) for r in replicas]
    holder = {"pelican": 0, "juniper": 1}
    client = None
    try:
        router.wait_ready()
        time.sleep(0.5)  # the SUB sockets' connections (ZMQ drops what comes before them)
        for name, i in holder.items():  # straight to the replica: the router sees no request
            complete(replicas[i].url, prefix(name) + "Warm-up:")
            wait_stored(subs[i], 7 * BLOCK)
        time.sleep(0.5)  # the router's subscribers read the same messages
        hits_before = [hits(r) for r in replicas]
        where: dict[str, list[int]] = {name: [] for name in holder}
        for turn in range(3):
            for name in holder:
                where[name].append(placed(replicas, lambda n=name, t=turn: complete(
                    router.url, prefix(n) + f"Question {t}:")))
        gained = [hits(r) - h for r, h in zip(replicas, hits_before)]
        lookups = httpx.get(router.metrics_url, timeout=10).text
        print(f"kv_aware: replica of each request by prefix {where} (holders {holder}), "
              f"prefix-cache hit tokens per replica {gained}, router lookups "
              f"{metric(lookups, 'vllm_router_kv_placement_lookups_total', result='hit')} hit")
        for name, i in holder.items():
            assert where[name] == [i, i, i], (name, where)
            assert gained[i] >= 3 * 7 * BLOCK, gained
        assert (metric(lookups, "vllm_router_kv_placement_lookups_total", result="hit")
                or 0) >= 6

        # chat goes through the chat render route; a repeat follows the first one's KV
        client = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0)
        messages = [{"role": "system", "content": prefix("lantern")},
                    {"role": "user", "content": "Say hi."}]

        def chat() -> None:
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                           temperature=0)

        for s in subs:
            drain(s)
        first = placed(replicas, chat)
        wait_stored(subs[first], 7 * BLOCK)
        time.sleep(0.5)
        assert placed(replicas, chat) == first
    finally:
        for s in subs:
            s.close()
        if client is not None:
            client.close()
        router.close()
