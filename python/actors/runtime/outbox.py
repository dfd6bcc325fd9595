"""The per-request Outbox: how generated output reaches an HTTP handler.

The producer (the tokenizer actor, detokenizing engine steps) must never wait for a slow
client, so `push` never blocks: deltas for a choice merge into one pending update until the
consumer calls `get`. Memory per request is therefore bounded by the request's own output
(max_tokens), not by how far the client has fallen behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from actors.runtime.failures import Outcome
from actors.runtime.messages import ChoiceTiming


@dataclass(slots=True)
class TokenLogprob:
    """The sampled token's logprob and the top alternatives at one position, with the text
    of each token as logprobs print it (decoded by the tokenizer actor, off the event loop)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    rank: int = 0  # set for prompt tokens (1: the most likely); 0: not computed
    text: str = ""  # token_id's text
    top_texts: tuple[str, ...] = ()  # parallel to top


@dataclass(slots=True)
class ChoiceUpdate:
    """Everything new for one choice since the consumer last read."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    # The prompt's logprobs (first entry None), once, on the first update of the first
    # choice of each prompt when the request asked for them.
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # A pooling request's vector (little-endian float32), with its finish.
    pooled: bytes | None = None
    # The choice's clock, with its finish (per-request metrics on; else None).
    timing: ChoiceTiming | None = None
    # With its finish: (weight version, first token, end) of each run of its output tokens
    # one weight version sampled (vLLM's weight_versions).
    weight_versions: tuple[tuple[str, int, int], ...] | None = None

    def size(self) -> int:
        """About how much memory this update takes, erring high (measured with tracemalloc:
        ~40 bytes a token id, ~200 a logprob, 90-100 an alternative with its text)."""
        return (len(self.text) + 40 * len(self.token_ids)
                + sum(200 + 140 * len(lp.top) for lp in self.logprobs))

    def merge(self, other: ChoiceUpdate) -> None:
        if other.prompt_logprobs is not None:
            self.prompt_logprobs = other.prompt_logprobs
        if other.pooled is not None:
            self.pooled = other.pooled
        if other.timing is not None:
            self.timing = other.timing
        if other.weight_versions is not None:
            self.weight_versions = other.weight_versions
        self.text += other.text
        self.token_ids.extend(other.token_ids)
        self.logprobs.extend(other.logprobs)
        if other.finish_reason is not None:
            self.finish_reason = other.finish_reason
            self.stop_reason = other.stop_reason


class OutboxFailed(Exception):
    """Raised to the consumer when the request failed after it was admitted. ``error`` says
    why, as a type (actors.errors.RequestRefused or actors.runtime.failures.RequestFailed);
    the consumer decides what that means to its client."""

    def __init__(self, error: Outcome) -> None:
        super().__init__(error.message)
        self.error = error
        self.message = error.message


class Outbox:
    """Coalescing single-consumer mailbox for the n choices of one request."""

    def __init__(self, num_choices: int) -> None:
        self._pending: dict[int, ChoiceUpdate] = {}
        self._unfinished = set(range(num_choices))
        self._error: OutboxFailed | None = None
        self._closed = False
        self._wakeup = trio.Event()

    # -- producer side (never blocks) -------------------------------------------------
    def push(self, update: ChoiceUpdate) -> None:
        if self._closed or self._error is not None or update.index not in self._unfinished:
            return
        pending = self._pending.get(update.index)
        if pending is None:
            self._pending[update.index] = update
        else:
            pending.merge(update)
        if update.finish_reason is not None:
            self._unfinished.discard(update.index)
        self._wakeup.set()

    def fail(self, error: Outcome) -> None:
        if self._closed or self._error is not None:
            return
        self._error = self._failed(error)
        self._wakeup.set()

    def _failed(self, error: Outcome) -> OutboxFailed:
        """The exception `get` raises; a front end's Outbox may raise a subclass."""
        return OutboxFailed(error)

    # -- consumer side ----------------------------------------------------------------
    @property
    def done(self) -> bool:
        """Every choice has finished and the consumer has read everything."""
        return not self._unfinished and not self._pending

    def pending_bytes(self) -> int:
        """About how many bytes of output wait for the consumer."""
        return sum(u.size() for u in self._pending.values())

    def is_finished(self, index: int) -> bool:
        return index not in self._unfinished

    async def get(self) -> list[ChoiceUpdate]:
        """Wait for news; return all pending updates in index order. Raises OutboxFailed."""
        while not self._pending and self._error is None:
            if not self._unfinished:
                return []
            await self._wakeup.wait()
            self._wakeup = trio.Event()
        if self._error is not None:
            raise self._error
        updates = [self._pending[i] for i in sorted(self._pending)]
        self._pending.clear()
        return updates

    def close(self) -> None:
        """The consumer is gone: drop whatever arrives from now on."""
        self._closed = True
        self._pending.clear()
