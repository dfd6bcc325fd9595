"""--kv-events-config: the prefix cache's events, read by a ZMQ SUB socket as a KV-aware
router reads vLLM's (three frames: topic, 8-byte sequence number, msgpack batch)."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import llmcore
import msgpack
import pytest
import zmq
from actors.core.kv_events import KVEventLog
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


def _prefix_hits(srv) -> float:
    text = httpx.get(f"{srv.url}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:prefix_cache_hits_total"))


def test_stored_chain_then_cleared(server):
    srv, sub = server
    prefix = list(range(1000, 1000 + 4 * BLOCK))
    hits_before = _prefix_hits(srv)
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
    # vLLM 0.34's fields for a one-group model: the group, its kind, one extra key a block
    assert first["group_idx"] == 0 and first["kv_cache_spec_kind"] == "full_attention"
    assert first["extra_keys"] == [None] * len(first["block_hashes"])
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
    deadline = time.monotonic() + 10
    while _prefix_hits(srv) - hits_before < 4 * BLOCK and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _prefix_hits(srv) - hits_before >= 4 * BLOCK
    # the chain is keyed by the engine's secret: not the one anyone can compute
    assert first["block_hashes"][0] != llmcore.block_hash(llmcore.hash_root(0),
                                                           prefix[:BLOCK])

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


# -- the publisher's exposure, in-process (no model) ------------------------------------------

def _non_loopback_address() -> str | None:
    """An address of this host other than loopback, or None when it has none."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, a route is chosen
        except OSError:
            return None
        addr = s.getsockname()[0]
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


def _publisher(**fields):
    from actors.core.kv_events import ZmqEventPublisher, parse_kv_events_config

    cfg = parse_kv_events_config('{"enable_kv_cache_events": true, "topic": "kv"}')
    port = free_port()
    cfg["endpoint"] = cfg["endpoint"].rsplit(":", 1)[0] + f":{port}"  # the default's host
    cfg.update(fields)
    return ZmqEventPublisher(cfg), port


def test_default_endpoint_is_loopback_and_bound():
    from actors.core.kv_events import parse_kv_events_config

    cfg = parse_kv_events_config('{"enable_kv_cache_events": true}')
    assert cfg["endpoint"] == "tcp://127.0.0.1:5557"
    pub, port = _publisher()
    ctx = zmq.Context()
    try:
        assert pub.bound == f"tcp://127.0.0.1:{port}"  # bound there, not connected to
        local = ctx.socket(zmq.SUB)
        local.setsockopt(zmq.SUBSCRIBE, b"kv")
        local.connect(f"tcp://127.0.0.1:{port}")
        other = _non_loopback_address()
        remote = None
        if other is not None:  # the same port on another interface of this host
            remote = ctx.socket(zmq.SUB)
            remote.setsockopt(zmq.SUBSCRIBE, b"kv")
            remote.connect(f"tcp://{other}:{port}")
        time.sleep(0.5)
        for _ in range(5):
            pub.publish([{"type": "AllBlocksCleared"}])
        assert _drain(local, 1.5), "nothing on loopback"
        if remote is not None:
            assert _drain(remote, 0.5) == [], f"published on {other}"
    finally:
        pub.close()
        ctx.destroy(0)


def test_explicit_endpoint_keeps_vllm_rule():
    from actors.core.kv_events import parse_kv_events_config

    cfg = parse_kv_events_config('{"enable_kv_cache_events": true, '
                                 '"endpoint": "tcp://*:6001"}')
    assert cfg["endpoint"] == "tcp://*:6001" and cfg["endpoint_bind"] is True
    cfg = parse_kv_events_config('{"enable_kv_cache_events": true, '
                                 '"endpoint": "tcp://10.1.2.3:6001"}')
    assert cfg["endpoint_bind"] is False  # a named host is connected to, as vLLM does
    with pytest.raises(ValueError, match="unknown field"):
        parse_kv_events_config('{"enable_kv_cache_events": true, "endpoint_bind": true}')


def test_oversized_subscription_is_dropped():
    pub, port = _publisher()
    ctx = zmq.Context()
    try:
        good = ctx.socket(zmq.SUB)
        good.setsockopt(zmq.SUBSCRIBE, b"kv")
        good.connect(f"tcp://127.0.0.1:{port}")
        bad = ctx.socket(zmq.SUB)
        bad.setsockopt(zmq.RECONNECT_IVL, 60_000)  # once dropped, it stays away
        bad.setsockopt(zmq.SUBSCRIBE, b"")
        # 64 KiB: far past any topic (libzmq keeps a subscription as a trie of one node a
        # byte: without the bound a 5 MB prefix cost the publisher about 230 MB)
        bad.setsockopt(zmq.SUBSCRIBE, b"x" * (1 << 16))
        bad.connect(f"tcp://127.0.0.1:{port}")
        time.sleep(1.0)
        for _ in range(5):
            pub.publish([{"type": "AllBlocksCleared"}])
        assert len(_drain(good, 1.5)) == 5
        assert _drain(bad, 0.5) == [], "a 64 KiB subscription frame was taken"
    finally:
        pub.close()
        ctx.destroy(0)


def test_oversized_replay_request_is_dropped():
    replay_port = free_port()
    pub, _ = _publisher(replay_endpoint=f"tcp://127.0.0.1:{replay_port}")
    ctx = zmq.Context()
    try:
        pub.publish([{"type": "AllBlocksCleared"}])
        time.sleep(0.3)
        bad = ctx.socket(zmq.DEALER)
        bad.setsockopt(zmq.RECONNECT_IVL, 60_000)
        bad.connect(f"tcp://127.0.0.1:{replay_port}")
        bad.send_multipart((b"", b"\0" * (1 << 20)))  # a 1 MiB "start" frame
        assert not bad.poll(1000), "a 1 MiB replay frame was read and answered"
        good = ctx.socket(zmq.DEALER)
        good.connect(f"tcp://127.0.0.1:{replay_port}")
        good.send_multipart((b"", (0).to_bytes(8, "big")))
        assert good.poll(5000), "replay stopped answering"
        frames = good.recv_multipart()
        assert frames[1] == b"kv" and int.from_bytes(frames[2], "big") == 0
    finally:
        pub.close()
        ctx.destroy(0)


def test_stores_name_the_group_and_its_kind():
    """vLLM 0.34's tags: group 0, full attention; a model whose every layer shares one window
    publishes that window's group as sliding_window with its size."""
    full, sliding = KVEventLog(BLOCK), KVEventLog(BLOCK, 512)
    for log in (full, sliding):
        log.stored([3, 4], [11, 12], None, list(range(2 * BLOCK)))
        log.allocated([3])
    (f_store, f_gone), (s_store, _) = full.take(), sliding.take()
    assert f_store["group_idx"] == 0 and f_store["kv_cache_spec_kind"] == "full_attention"
    assert "kv_cache_spec_sliding_window" not in f_store  # omitted at its default, as vLLM
    assert f_store["extra_keys"] == [None, None]
    assert f_gone == {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU",
                      "group_idx": 0}
    assert s_store["kv_cache_spec_kind"] == "sliding_window"
    assert s_store["kv_cache_spec_sliding_window"] == 512
