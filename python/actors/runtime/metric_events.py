"""Messages to the metrics actor. Sent with send_nowait; a full channel drops and counts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SequenceFinished:
    finish_reason: str  # stop | length | abort | error
    num_prompt_tokens: int
    num_generation_tokens: int
    e2e_seconds: float
    queue_seconds: float | None
    ttft_seconds: float | None
    inter_token_seconds: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine's gauges and cumulative counters."""

    num_running: int
    num_waiting: int
    kv_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int


MetricEvent = SequenceFinished | EngineStats
