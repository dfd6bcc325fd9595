"""The metrics actor applies whatever the engine reports without dying: a step whose cached
prompt part exceeds its prompt (or any negative count) is clamped, never a ValueError from
a Prometheus counter (which would end the actor, and with it the server)."""

from __future__ import annotations

import trio

from actors.runtime.messages import StepTokens
from actors.runtime.metrics_actor import MetricsActor
from server_helpers import metric


def test_counts_that_would_go_negative_are_clamped() -> None:
    _send, recv = trio.open_memory_channel(1)
    actor = MetricsActor("m", 1024, recv)
    actor.apply(StepTokens(5, 9, 2))  # more cached than prompt
    actor.apply(StepTokens(-3, -1, -4))  # nothing can be negative
    actor.apply(StepTokens(10, 4, 3))
    text = actor.exposition().decode()
    assert metric(text, "vllm:prompt_tokens_total") == 15.0
    assert metric(text, "vllm:prompt_tokens_by_source_total", source="local_compute") == 6.0
    assert metric(text, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 9.0
    assert metric(text, "vllm:generation_tokens_total") == 5.0
