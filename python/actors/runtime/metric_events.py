"""Messages to the metrics actor. Sent with send_nowait; a full channel drops and counts."""

from __future__ import annotations

from dataclasses import dataclass

from actors.messages import EngineStats


@dataclass(frozen=True, slots=True)
class StepTokens:
    """What one engine step produced, counted as vLLM counts an iteration.

    A sequence's whole prompt counts in the step that draws its first token (prefix-cache
    hits included, split out in num_cached_prompt_tokens), so over a request's life the
    steps add up to prompt + generated tokens.
    """

    num_prompt_tokens: int
    num_cached_prompt_tokens: int
    num_generation_tokens: int


@dataclass(frozen=True, slots=True)
class SequenceFinished:
    finish_reason: str  # stop | length | abort | error
    num_prompt_tokens: int
    num_generation_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    max_tokens: int | None
    e2e_seconds: float
    queue_seconds: float | None
    ttft_seconds: float | None
    inter_token_seconds: tuple[float, ...]
    # Phases, None when the sequence never reached them (aborted while queued):
    #   prefill = first token - scheduled, decode = last token - first token,
    #   inference = last token - scheduled.
    prefill_seconds: float | None = None
    decode_seconds: float | None = None
    inference_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class GroupFinished:
    """The n sequences of one prompt have all finished (vLLM's parent request)."""

    n: int
    max_num_generation_tokens: int


MetricEvent = StepTokens | SequenceFinished | GroupFinished | EngineStats
