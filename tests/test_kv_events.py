"""--kv-events-config: the prefix cache's events, read by a ZMQ SUB socket as a KV-aware
router reads vLLM's (three frames: topic, 8-byte sequence number, msgpack batch)."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import msgpack
import pytest
import zmq
from server_helpers import ServerProcess, free_port

BLOCK = 16


@pytest.fixture(scope="module")
def server():
    port = free_port()
    cfg = ('{"enable_kv_cache_events": true, "publisher": "zmq", '
           f'"endpoint": "tcp://*:{port}", "topic": "kv"}}')
    srv = ServerProcess("--kv-events-config", cfg, "--enable-dev-endpoints",
                        "--block-size", str(BLOCK))
    try:
        srv.wait_ready()
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.connect(f"tcp://127.0.0.1:{port}")
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        time.sleep(0.5)  # the subscription reaches the publisher
        yield srv, sub
        sub.close(0)
        ctx.term()
    finally:
        srv.stop()


def _drain(sub, seconds: float = 3.0) -> list[tuple[bytes, int, list]]:
    out, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        if sub.poll(100):
            topic, seq, payload = sub.recv_multipart()
            out.append((topic, int.from_bytes(seq, "big"), msgpack.unpackb(payload)))
    return out


def _complete(srv, prompt: list[int]) -> None:
    r = httpx.post(f"{srv.url}/v1/completions", timeout=120, json={
        "model": "SmolLM2-135M-Instruct", "prompt": prompt, "max_tokens": 1,
        "temperature": 0})
    assert r.status_code == 200, r.text


def test_stored_chain_then_cleared(server):
    srv, sub = server
    prefix = list(range(1000, 1000 + 4 * BLOCK))
    _complete(srv, prefix + [7, 8, 9])
    _complete(srv, prefix + [5, 6])
    msgs = _drain(sub)
    assert msgs, "no KV events"
    seqs = [m[1] for m in msgs]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert {m[0] for m in msgs} == {b"kv"}
    stored = [e for _, _, (ts, events, rank) in msgs for e in events
              if e["type"] == "BlockStored"]
    assert all(isinstance(b[0], float) and b[2] == 0 for _, _, b in msgs)
    first = stored[0]
    assert first["parent_block_hash"] is None and first["block_size"] == BLOCK
    assert first["medium"] == "GPU" and first["lora_id"] is None
    # the prompt's full blocks, each block's parent the one before
    hashes = [h for e in stored for h in e["block_hashes"]]
    tokens = [t for e in stored for t in e["token_ids"]]
    assert tokens[: 4 * BLOCK] == prefix
    chain = [first["parent_block_hash"], *first["block_hashes"]]
    for e in stored[1:]:
        assert e["parent_block_hash"] in hashes
    assert len(chain) >= 2
    # the second request hit the cache: its shared prefix is not stored again
    assert len(set(hashes)) == len(hashes)

    r = httpx.post(f"{srv.url}/reset_prefix_cache", timeout=30)
    assert r.status_code == 200, r.text
    after = _drain(sub, 2.0)
    events = [e for _, _, b in after for e in b[1]]
    assert {"type": "AllBlocksCleared"} in events
    assert after[0][1] > seqs[-1]


def test_bad_config_exits_2():
    for bad in ('{"enable_kv_cache_events": true, "bogus": 1}', "[1]",
                '{"enable_kv_cache_events": true, "endpoint": "http://x:1"}'):
        p = subprocess.run([sys.executable, "-m", "server", "--kv-events-config", bad],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, p.stderr
        assert "--kv-events-config" in p.stderr
