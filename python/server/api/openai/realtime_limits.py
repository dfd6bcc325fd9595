"""What bounds a realtime connection, and the close each bound ends it with.

Audio is held from its append until its window is transcribed. Each connection may hold
--realtime-max-buffer-s seconds of it, all of them together
--realtime-max-total-buffer-bytes (the `AudioBudget`, one per server); a chunk past either
closes its connection: 1009 for its own bound (it sends more than it lets the server
transcribe), 1013 "try again later" for the server's. Other connections are untouched.

A client may run ahead of the wall clock by --realtime-max-lead-s seconds of audio (the
`LeadMeter`: a bucket that fills with each chunk's duration and drains at one second per
second), so a file streamed at full speed is served up to that lead and live audio never
comes near it; beyond it the connection is closed (1008). A client that sends no event
for --realtime-idle-timeout while none of its audio awaits transcription is closed (1008),
as is one that leaves --realtime-max-unsent-bytes of events unread.

Every close is counted by reason in `llmserve_realtime_closed_total`, beside vLLM's
`vllm:websocket_connections_active` and `_total`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from server.audio.mel import SAMPLE_RATE
from server.config import ServerConfig

BYTES_PER_SAMPLE = 2  # held as PCM16 counts it, whatever the array's dtype

# Close codes (RFC 6455 section 7.4.1).
NORMAL, POLICY, TOO_BIG, INTERNAL, TRY_LATER = 1000, 1008, 1009, 1011, 1013


@dataclass(frozen=True)
class Close:
    code: int
    reason: str  # at most 123 bytes: a close frame's limit
    why: str  # the metric's label

    def __post_init__(self) -> None:
        assert len(self.reason.encode()) <= 123, self.reason


@dataclass(frozen=True)
class RealtimeLimits:
    max_chunk_bytes: int
    max_buffer_samples: int
    idle_timeout: float
    max_lead_s: float
    max_unsent_bytes: int

    @classmethod
    def of(cls, cfg: ServerConfig) -> RealtimeLimits:
        return cls(max_chunk_bytes=cfg.realtime_max_chunk_bytes,
                   max_buffer_samples=int(cfg.realtime_max_buffer_s * SAMPLE_RATE),
                   idle_timeout=cfg.realtime_idle_timeout,
                   max_lead_s=cfg.realtime_max_lead_s,
                   max_unsent_bytes=cfg.realtime_max_unsent_bytes)

    def buffer_full(self) -> Close:
        return Close(TOO_BIG, f"audio buffer over {self.max_buffer_samples / SAMPLE_RATE:g} "
                     "s untranscribed (--realtime-max-buffer-s)", "buffer")

    def too_fast(self) -> Close:
        return Close(POLICY, f"audio over {self.max_lead_s:g} s ahead of real time "
                     "(--realtime-max-lead-s)", "rate")

    def idle(self) -> Close:
        return Close(POLICY, f"no event for {self.idle_timeout:g} s "
                     "(--realtime-idle-timeout)", "idle")

    def not_reading(self) -> Close:
        return Close(POLICY, f"client not reading: over {self.max_unsent_bytes} bytes of "
                     "events unsent (--realtime-max-unsent-bytes)", "slow_client")


SERVER_FULL = Close(TRY_LATER, "server audio buffers full "
                    "(--realtime-max-total-buffer-bytes); try again later", "server_full")
NOT_READY = Close(TRY_LATER, "the model is still loading", "not_ready")
FAILED = Close(INTERNAL, "the engine has failed", "failed")
CLIENT_DONE = Close(NORMAL, "", "client")
INTERNAL_ERROR = Close(INTERNAL, "internal error", "internal")


class AudioBudget:
    """The audio all connections hold, in PCM16 bytes, against one bound."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0

    def take(self, samples: int) -> bool:
        n = samples * BYTES_PER_SAMPLE
        if self.held + n > self.max_bytes:
            return False
        self.held += n
        return True

    def give(self, samples: int) -> None:
        self.held -= samples * BYTES_PER_SAMPLE
        assert self.held >= 0


class LeadMeter:
    """How far a client's audio runs ahead of the clock: +duration per chunk, -1 s per s,
    never below 0."""

    def __init__(self) -> None:
        self.lead = 0.0
        self._at: float | None = None

    def add(self, now: float, seconds: float) -> float:
        if self._at is not None:
            self.lead = max(0.0, self.lead - (now - self._at))
        self._at = now
        self.lead += seconds
        return self.lead


class RealtimeMetrics:
    """The route's series, on the server's metrics registry once the engine is up."""

    def __init__(self) -> None:
        self._registry: Any = None

    def _bind(self, srv: Any) -> bool:
        metrics = getattr(srv, "metrics", None)
        if metrics is None:
            return False
        if self._registry is not metrics.registry:
            from prometheus_client import Counter, Gauge

            r = self._registry = metrics.registry
            self.active = Gauge("vllm:websocket_connections_active",
                                "Number of currently active WebSocket connections.",
                                registry=r)
            self.total = Counter("vllm:websocket_connections_total",
                                 "Total number of WebSocket connections.", registry=r)
            self.closed = Counter("llmserve_realtime_closed",
                                  "Realtime connections ended, by why.", ["reason"],
                                  registry=r)
        return True

    def opened(self, srv: Any) -> None:
        if self._bind(srv):
            self.active.inc()
            self.total.inc()

    def ended(self, srv: Any, why: str) -> None:
        if self._bind(srv):
            self.active.dec()
            self.closed.labels(why).inc()
