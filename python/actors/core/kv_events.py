"""KV-cache events, published the way vLLM publishes them (``--kv-events-config``).

A router that routes by prefix-cache contents (vllm-router's ``kv_aware``) subscribes to
each engine's ZMQ PUB socket and keeps an index of the full blocks every engine holds.
The wire format is vLLM's, so any consumer of vLLM's events reads ours:

- each message is three frames: the topic (UTF-8), an 8-byte big-endian sequence number
  (0, 1, 2, ... per publisher), and a msgpack payload;
- the payload is a batch, a positional array ``[ts, events, data_parallel_rank]``
  (vLLM's ``EventBatch`` with ``array_like=True``);
- each event is a msgpack map whose first key ``type`` names it (msgspec's tagged
  struct): ``BlockStored`` {block_hashes, parent_block_hash, token_ids, block_size,
  lora_id, medium, lora_name, extra_keys (one null a block), group_idx 0,
  kv_cache_spec_kind "full_attention", or "sliding_window" with kv_cache_spec_sliding_window
  when every layer shares one window}, ``BlockRemoved`` {block_hashes, medium, group_idx 0},
  ``AllBlocksCleared`` {}: what vLLM 0.34's block pool sends for that group. Fields that
  vLLM omits at their default (session_id, locality, lookahead_token_ids, ...) are omitted
  here too.
- block hashes are the pool's 64-bit chained hashes, sent as unsigned ints (vLLM's
  ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` form). A consumer uses them only as keys: to
  chain a store to its parent and to find what a removal names; the token ids carry the
  content. The chains are keyed by each engine's secret (actors.core.kv_manager), so a
  hash is stable for the engine's life but says nothing across engines or restarts; vLLM's
  are keyed per process by a random root too.
- replay (optional ``replay_endpoint``, a ROUTER socket): a request
  ``[identity, b"", start_seq(8 bytes)]`` gets every buffered batch from start_seq on as
  ``[identity, b"", topic, seq, payload]``, then ``[identity, b"", b"", -1(8 bytes,
  signed), b""]``.

Exposure. A BlockStored event carries the token ids of the block, so a subscriber reads
every prompt the engine caches (in blocks), and ZMQ asks no credentials. The endpoint
therefore defaults to ``tcp://127.0.0.1:5557``, bound on loopback (vLLM binds
``tcp://*:5557``); another interface is used only when the config's ``endpoint`` names it:
``tcp://*:PORT`` binds every interface (logged as a warning), and a named host is connected
to, vLLM's rule (a broker or a subscriber that binds). Put a wider endpoint only on a
network where every host may read the prompts. Every socket refuses a peer frame over
``MAX_PEER_FRAME`` bytes (``zmq.MAXMSGSIZE``: the peer is dropped): a subscription is a
topic prefix and a replay request three short frames, while libzmq keeps a subscription as
a trie of one node a byte (a 5 MB prefix cost the publisher about 230 MB).

Only the default namespace's chains are published: a chain under a cache salt or a LoRA
adapter (actors.core.kv_manager) is kept out, since a consumer that keys blocks by token
ids alone would take them for the base model's.

The engine collects a step's events (``KVEventLog``, fed by the KVManager) and hands them
to ``ZmqEventPublisher.publish``, which only enqueues; a thread of its own encodes and
sends. A full queue drops the batch (counted), and the PUB socket drops past its
high-water mark, so a slow or absent subscriber never holds the engine back.

This module imports only the standard library at import time: the CLI validates the flag
with it; zmq and msgpack are imported by the publisher.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import deque
from typing import Any

__all__ = ["KVEventLog", "ZmqEventPublisher", "offset_endpoint", "parse_kv_events_config"]

log = logging.getLogger("actors.kv_events")

MEDIUM = "GPU"  # vLLM's medium for an engine's own KV cache; consumers score it as resident
# The published group (actors.core.kv_groups: group 0, the full-attention one when the model
# has any). vLLM 0.34 tags each store with its group and the group's spec kind (and each
# removal with its group), so that a consumer can tell the groups of a hybrid model apart.
GROUP_IDX = 0

# vLLM's KVEventsConfig fields and defaults (vllm/config/kv_events.py)
DEFAULTS: dict[str, Any] = {
    "enable_kv_cache_events": False,
    "publisher": None,  # None: "zmq" when enabled, else "null"
    "endpoint": "tcp://127.0.0.1:5557",  # vLLM's is tcp://*:5557 (see Exposure above)
    "replay_endpoint": None,
    "buffer_steps": 10_000,
    "hwm": 100_000,
    "max_queue_size": 100_000,
    "topic": "",
}
_PUBLISHERS = ("null", "zmq")
_SCHEMES = ("tcp://", "ipc://", "inproc://")
# The largest frame a peer may send (zmq.MAXMSGSIZE): a subscription frame is one byte
# plus a topic prefix, a replay request's longest frame is 8 bytes.
MAX_PEER_FRAME = 4096


def _binds(endpoint: str) -> bool:
    """vLLM's rule for an endpoint the config names: a wildcard host, ipc and inproc bind;
    a named host is connected to."""
    return ("*" in endpoint or "::" in endpoint
            or endpoint.startswith(("ipc://", "inproc://")))


def _all_interfaces(endpoint: str) -> bool:
    host = endpoint.removeprefix("tcp://").rpartition(":")[0]
    return endpoint.startswith("tcp://") and host in ("*", "0.0.0.0", "[::]", "::", "[*]")


def parse_kv_events_config(text: str) -> dict[str, Any] | None:
    """--kv-events-config: a JSON object of vLLM's KVEventsConfig fields.

    Returns the full config (defaults filled in) when events are to be published, None when
    they are off (enable_kv_cache_events false, or publisher "null"). Raises ValueError
    naming the first problem. The result adds ``endpoint_bind``: whether the publisher binds
    the endpoint (the loopback default, or vLLM's rule for a named one) or connects to it.
    """
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not a JSON object: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"not a JSON object: {text!r}")  # noqa: TRY004 (argparse reads it)
    unknown = sorted(set(doc) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)} (known: "
                         f"{', '.join(DEFAULTS)})")
    cfg = {**DEFAULTS, **doc}
    if not isinstance(cfg["enable_kv_cache_events"], bool):
        raise ValueError("enable_kv_cache_events must be true or false")  # noqa: TRY004
    if cfg["publisher"] is None:
        cfg["publisher"] = "zmq" if cfg["enable_kv_cache_events"] else "null"
    if cfg["publisher"] not in _PUBLISHERS:
        raise ValueError(f"publisher must be one of {', '.join(_PUBLISHERS)}, "
                         f"got {cfg['publisher']!r}")
    for name in ("endpoint", "replay_endpoint"):
        value = cfg[name]
        if value is None and name == "replay_endpoint":
            continue
        if not isinstance(value, str) or not value.startswith(_SCHEMES):
            raise ValueError(f"{name} must be a ZMQ address (tcp://, ipc:// or inproc://), "
                             f"got {value!r}")
        if value.startswith("tcp://"):
            port = value.rpartition(":")[2]
            if not port.isdigit() or int(port) > 65535:
                raise ValueError(f"{name} {value!r} has no port (tcp://HOST:PORT)")
    for name, low in (("buffer_steps", 1), ("hwm", 0), ("max_queue_size", 1)):
        value = cfg[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if not isinstance(cfg["topic"], str):
        raise ValueError(f"topic must be a string, got {cfg['topic']!r}")  # noqa: TRY004
    if not cfg["enable_kv_cache_events"] or cfg["publisher"] == "null":
        return None
    cfg["endpoint_bind"] = "endpoint" not in doc or _binds(cfg["endpoint"])
    return cfg


def offset_endpoint(endpoint: str | None, rank: int) -> str | None:
    """The endpoint of data-parallel rank ``rank``: a TCP port plus the rank (port 0 is left
    to the OS), an inproc name with ``_dp<rank>``; vLLM's rule, so a router lists the
    engines' endpoints the same way for both servers."""
    if not endpoint or rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{rank}"
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        return endpoint if int(port) == 0 else f"{base}:{int(port) + rank}"
    return endpoint


def _resolved(endpoint: str | None, bound: str | None) -> str | None:
    """The endpoint a subscriber connects to: a bound ``tcp://HOST:0`` as ZMQ bound it."""
    if endpoint and bound and endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        return bound
    return endpoint


class KVEventLog:
    """The events of the KV cache since the last ``take``, and which cached blocks were
    published: block id -> hash, so that an eviction on allocation (the pool drops a free
    cached block's hash when it hands the block out) can be told as a BlockRemoved."""

    __slots__ = ("_by_hash", "_held", "_spec", "block_size", "events")

    def __init__(self, block_size: int, window: int | None = None) -> None:
        """``window``: the published group's sliding window (None: full attention)."""
        self.block_size = block_size
        self._spec: dict[str, Any] = (
            {"kv_cache_spec_kind": "full_attention"} if window is None else
            {"kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": window})
        self.events: list[dict[str, Any]] = []
        self._held: dict[int, int] = {}  # block id -> hash it is registered under
        self._by_hash: dict[int, int] = {}  # hash -> block id holding it

    def holds(self, block_hash: int) -> bool:
        return block_hash in self._by_hash

    def stored(self, block_ids: list[int], hashes: list[int], parent: int | None,
               token_ids: list[int]) -> None:
        """A run of newly registered full blocks of one chain, ``parent`` the hash before
        the first (None: the chain's root)."""
        for bid, h in zip(block_ids, hashes):
            self._held[bid] = h
            self._by_hash[h] = bid
        self.events.append({
            "type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
            "token_ids": list(token_ids), "block_size": self.block_size, "lora_id": None,
            "medium": MEDIUM, "lora_name": None, "extra_keys": [None] * len(hashes),
            "group_idx": GROUP_IDX, **self._spec,
        })

    def allocated(self, block_ids: list[int]) -> None:
        """Blocks the pool handed out: any that held a published hash lost it."""
        held = self._held
        gone = [h for h in (held.pop(b, None) for b in block_ids) if h is not None]
        if gone:
            for h in gone:
                del self._by_hash[h]
            self.events.append({"type": "BlockRemoved", "block_hashes": gone,
                                "medium": MEDIUM, "group_idx": GROUP_IDX})

    def cleared(self) -> None:
        self._held.clear()
        self._by_hash.clear()
        self.events.append({"type": "AllBlocksCleared"})

    def take(self) -> list[dict[str, Any]]:
        events, self.events = self.events, []
        return events


class ZmqEventPublisher:
    """One engine's PUB socket (and optional replay ROUTER), served by a thread.

    ``publish`` never blocks: it enqueues the batch, or drops it when ``max_queue_size``
    batches are waiting. Bind failures surface from the constructor.
    """

    END_SEQ = (-1).to_bytes(8, "big", signed=True)

    def __init__(self, cfg: dict[str, Any], data_parallel_rank: int = 0) -> None:
        self.rank = data_parallel_rank
        self.endpoint = offset_endpoint(cfg["endpoint"], data_parallel_rank)
        self._bind = bool(cfg.get("endpoint_bind", _binds(self.endpoint)))
        self._max_frame = MAX_PEER_FRAME + len(str(cfg["topic"]).encode())
        self.bound: str | None = None  # the address bound (ZMQ's last endpoint), if bound
        self.replay_endpoint = offset_endpoint(cfg["replay_endpoint"], data_parallel_rank)
        self.replay_bound: str | None = None
        self._hwm = int(cfg["hwm"])
        self._topic = str(cfg["topic"]).encode()
        self._queue: queue.Queue[tuple[float, list[dict[str, Any]]] | None] = queue.Queue(
            maxsize=int(cfg["max_queue_size"]))
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=int(cfg["buffer_steps"]))
        self.dropped = 0  # batches dropped because the queue was full
        self.sent = 0
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"kv-events-{self.rank}",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise RuntimeError(f"--kv-events-config: cannot open {self.endpoint}: "
                               f"{self._error}") from self._error
        log.info("KV events: publishing on %s%s (topic %r, rank %d)", self.endpoint,
                 f", replay on {self.replay_endpoint}" if self.replay_endpoint else "",
                 self._topic.decode(), self.rank)
        for ep in (self.endpoint if self._bind else None, self.replay_endpoint):
            if ep is not None and _all_interfaces(ep):
                log.warning("KV events: %s is bound on every interface; any host that can "
                            "reach it reads the token ids of every cached prompt (ZMQ asks "
                            "no credentials)", ep)

    def source(self) -> dict[str, Any]:
        """This publisher as vLLM's KVEventsConfig reports a running one (what
        /kv_event_sources lists for its rank): the endpoints offset for the rank, and a TCP
        port 0 resolved to the port the OS gave."""
        return {"enable_kv_cache_events": True, "publisher": "zmq",
                "endpoint": _resolved(self.endpoint, self.bound),
                "replay_endpoint": _resolved(self.replay_endpoint, self.replay_bound),
                "buffer_steps": self._buffer.maxlen, "hwm": self._hwm,
                "max_queue_size": self._queue.maxsize, "topic": self._topic.decode()}

    def publish(self, events: list[dict[str, Any]]) -> None:
        """Hands one step's events to the thread (called from the engine's step)."""
        try:
            self._queue.put_nowait((time.time(), events))
        except queue.Full:
            self.dropped += 1

    def close(self, timeout: float = 1.0) -> None:
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            import msgpack
            import zmq

            ctx = zmq.Context()
            pub = ctx.socket(zmq.PUB)
            pub.setsockopt(zmq.SNDHWM, self._hwm)
            pub.setsockopt(zmq.LINGER, 0)
            pub.setsockopt(zmq.MAXMSGSIZE, self._max_frame)
            if self._bind:
                pub.bind(self.endpoint)
                self.bound = pub.getsockopt_string(zmq.LAST_ENDPOINT)
            else:
                pub.connect(self.endpoint)
            replay = None
            if self.replay_endpoint is not None:
                replay = ctx.socket(zmq.ROUTER)
                replay.setsockopt(zmq.LINGER, 0)
                replay.setsockopt(zmq.MAXMSGSIZE, self._max_frame)
                replay.bind(self.replay_endpoint)
                self.replay_bound = replay.getsockopt_string(zmq.LAST_ENDPOINT)
        except Exception as exc:  # noqa: BLE001 (reported by the constructor)
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        pack = msgpack.Packer(use_bin_type=True).pack
        seq = 0
        try:
            while True:
                if replay is not None and replay.poll(0):
                    self._serve_replay(replay)
                try:
                    item = self._queue.get(timeout=0.05)
                except queue.Empty:
                    continue
                if item is None:
                    break
                ts, events = item
                payload = pack([ts, events, self.rank])
                seq_bytes = seq.to_bytes(8, "big")
                try:
                    # a PUB socket never blocks: past the high-water mark ZMQ drops
                    pub.send_multipart((self._topic, seq_bytes, payload), flags=zmq.NOBLOCK)
                except zmq.Again:
                    self.dropped += 1
                self._buffer.append((seq, payload))
                self.sent += 1
                seq += 1
        except Exception:
            log.exception("KV events publisher stopped")
        finally:
            pub.close(0)
            if replay is not None:
                replay.close(0)
            ctx.term()

    def _serve_replay(self, replay: Any) -> None:
        frames = replay.recv_multipart()
        if len(frames) != 3:
            log.warning("KV events: ignoring a replay request of %d frames", len(frames))
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= start_seq:
                replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"),
                                       payload))
        replay.send_multipart((client, b"", b"", self.END_SEQ, b""))
