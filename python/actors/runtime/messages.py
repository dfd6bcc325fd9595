"""The runtime's vocabulary: every message that crosses a channel between its actors.

With the core's ``actors.messages`` (Admit, Abort, TokenBatch, RequestOutput, Control) this
module is the whole language of the engine side: what each actor may say to another.

    HTTP --Submit--------------------> tokenizer actor      (submit channel)
    HTTP --AbortRequest--------------> tokenizer actor      (a call; never blocks)
    tokenizer --Admit | AbortChoices | NoMoreAdmits--> engine actor   (engine inbox)
    engine actor --Delivery | EngineDown---------------> tokenizer   (batch channel)
    engine actor --MetricEvent-----------------------> metrics actor (metrics channel)
    tokenizer --ChoiceUpdate--> Outbox (per request; actors.runtime.outbox) --> HTTP

Ownership follows the arrows: the tokenizer actor is the one owner of each request's
state (actors.runtime.request: RequestState, its engine requests, choices and Outbox);
the engine actor owns the core and, per admitted prompt, its timing (actors.runtime
.accounting). Neither writes the other's objects: they exchange these frozen messages.

Every message here is frozen. A ChoiceUpdate (Outbox content, merged while it waits for
its reader) is the one mutable exception and lives with the Outbox.
"""

from __future__ import annotations

from dataclasses import dataclass

from actors.messages import Admit, EngineStats, RequestOutput
from actors.runtime.failures import Outcome

__all__ = [
    "AbortChoices", "AbortRequest", "BatchMessage", "ChoiceTiming", "Delivery", "EngineDown",
    "EngineInbox",
    "GroupFinished", "MetricEvent", "NoMoreAdmits", "Refused", "Retired", "SequenceFinished",
    "StepTokens", "Submit",
]


# -- HTTP -> tokenizer actor ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Submit:
    """A registered request (actors.runtime.request.Registry) holding its admission slots,
    handed to the tokenizer actor: render, tokenize, check and admit its prompts."""

    request_id: str


@dataclass(frozen=True, slots=True)
class AbortRequest:
    """End every unfinished choice of a request with finish_reason "abort" (a reader still
    reading sees it) and stop it in the engine; a request still being tokenized is never
    admitted. Idempotent."""

    request_id: str


# -- tokenizer actor -> engine actor (one ordered inbox) ---------------------------------


@dataclass(frozen=True, slots=True)
class AbortChoices:
    """Stop choice ``index`` of an engine request (None: every choice) in the engine.
    ``reason`` is its finish reason as the tokenizer decided it ("stop": a stop string
    matched; "abort"), which its metrics report. Sent after the request's Admit, on the
    same inbox, so the engine never sees an abort before what it aborts."""

    engine_id: str
    index: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class NoMoreAdmits:
    """The tokenizer's submissions have ended (shutdown): once the core has finished what
    it holds, the engine actor ends and closes the batch channel. Aborts may still follow."""


EngineInbox = Admit | AbortChoices | NoMoreAdmits


# -- engine actor -> tokenizer actor (batch channel) -------------------------------------


@dataclass(frozen=True, slots=True)
class Retired:
    """Choice ``index`` of ``engine_id`` will never be touched by the engine again (it
    finished, was aborted, or never reached the core); ``reason`` is its finish reason."""

    engine_id: str
    index: int
    reason: str


@dataclass(frozen=True, slots=True)
class Refused:
    """The engine refused an admit (paused, or the core's own checks): the request fails
    with ``error``; a Retired for each of its choices follows."""

    engine_id: str
    error: Outcome


@dataclass(frozen=True, slots=True)
class ChoiceTiming:
    """A choice's clock as the engine actor's ledger holds it after a step (time.monotonic()
    seconds; None: not reached yet): its request's arrival, when the choice was first
    scheduled, and when its first and latest tokens came. The per-request metrics
    (--enable-per-request-metrics) are computed from the one its last output carried."""

    arrival: float
    scheduled: float | None
    first_token: float | None
    last_token: float | None


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message per send, under one batch credit: a step's outputs, then what retired
    since the previous Delivery (in that order: a choice's last tokens before its end).
    ``timings``: empty, or (per-request metrics on) one ChoiceTiming per output;
    ``weight_version``: the label of the weights that produced the outputs."""

    outputs: tuple[RequestOutput, ...] = ()
    retired: tuple[Retired | Refused, ...] = ()
    timings: tuple[ChoiceTiming | None, ...] = ()
    weight_version: str = "default"


@dataclass(frozen=True, slots=True)
class EngineDown:
    """A step failed: the engine will never step again, every request fails with ``error``
    and retires."""

    error: Outcome


BatchMessage = Delivery | EngineDown


# -- engine actor -> metrics actor (send_nowait; a full channel drops and counts) --------


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
