"""Messages to the metrics actor. Sent with send_nowait; a full channel drops and counts."""

from __future__ import annotations

from dataclasses import dataclass

from actors.messages import EngineStats
from actors.runtime.request import Choice, EngineRequest


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
    # Sequences the step moved from waiting to running (a burst admitted together is one
    # step with all of them: actors.runtime.burst).
    num_admitted_sequences: int = 0


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


def sequence_finished(req: EngineRequest, choice: Choice, now: float) -> SequenceFinished:
    """The metrics of a choice that retired at `now` (monotonic seconds)."""
    scheduled, first, last = choice.scheduled_at, choice.first_token_at, choice.last_token_at
    started = scheduled is not None and first is not None and last is not None
    return SequenceFinished(
        finish_reason=choice.finish_reason or "error",
        num_prompt_tokens=len(req.prompt_token_ids),
        num_generation_tokens=choice.num_generated,
        num_cached_tokens=choice.num_cached_tokens,
        num_preemptions=choice.num_preemptions,
        max_tokens=req.params.max_tokens,
        e2e_seconds=now - req.admitted_at,
        queue_seconds=None if scheduled is None else scheduled - req.admitted_at,
        ttft_seconds=None if first is None else first - req.admitted_at,
        inter_token_seconds=tuple(choice.inter_token),
        prefill_seconds=first - scheduled if started else None,  # type: ignore[operator]
        decode_seconds=last - first if started else None,  # type: ignore[operator]
        inference_seconds=last - scheduled if started else None,  # type: ignore[operator]
    )
