"""The sampler's token mask over a grammar ``Matcher``: constrained decoding's last hop.

The runner builds one ``MatcherMask`` per choice from the spec its ``NewSeq`` carries and
hangs it on the choice's ``SamplingHooks``; the sampler then fills its bitmask row every
step and feeds it each drawn token. The sampler's row is as wide as the model's logits; a
backend built over a larger tokenizer writes into a scratch row cut to that width.

A matcher that stops following its tokens (it refuses a token, or its fill raises) allows
only the end-of-sequence tokens: the choice then ends, instead of the step failing. A matcher
whose ``accept``, ``rollback`` or ``replay`` raises (a backend bug; llguidance refusing a
rollback), or that cannot be built at all, leaves its state unknown: the mask records why in
``failed``, allows only end-of-sequence from then on, and the sampler refuses the choice's
next draw, so the request ends with an "error" finish (a 500, as vLLM answers one) while the
rest of the step goes on. Nothing a matcher raises leaves this module.

Fast-forward (``MatcherMask.fast_forward``): right after a draw the mask computes the next
position's allowed set; while that set is a single token (not an end-of-sequence token),
the sampler could only draw that token, whatever the logits, the temperature or the seed,
so it is taken at once and the choice skips that model step. The tokens forced this way
are exactly those the masked sampler would have drawn: the step that follows feeds them to
the model as one chunk. The last set computed (not a single token) is kept and serves the
next step's ``fill_bitmask``, so the look-ahead costs no extra mask fill.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from actors.core.structured.backend import Matcher, bitmask_words

__all__ = ["EosOnlyMask", "MatcherMask", "mask_for"]

log = logging.getLogger("actors.core.structured.mask")

# The fault point matcher_accept (actors.runtime.faults, LLMSERVE_FAULT_INJECT) while it is
# planned: the matchers built meanwhile call it before every accept. None otherwise.
_accept_fault: Callable[[], None] | None = None


def set_accept_fault(hook: Callable[[], None] | None) -> None:
    global _accept_fault
    _accept_fault = hook


class _FaultyAccept:
    """A matcher whose ``accept`` first passes the fault point (built only while it is
    planned, so the accept of every other matcher carries no check)."""

    __slots__ = ("_fault", "_inner")

    def __init__(self, inner: Matcher, fault: Callable[[], None]) -> None:
        self._inner = inner
        self._fault = fault

    def accept(self, token_id: int) -> bool:
        self._fault()
        return self._inner.accept(token_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class MatcherMask:
    """``sampler.TokenMask`` over one choice's matcher. ``_taken`` records, per token the
    sampler reported, whether the matcher took it, so a rollback undoes exactly that.
    ``failed``: why the matcher can no longer be trusted (None while it can)."""

    __slots__ = ("_eos", "_m", "_next", "_next_valid", "_scratch", "_taken", "failed")

    def __init__(self, matcher: Matcher, backend_vocab: int, vocab_size: int,
                 eos_token_ids: Iterable[int]) -> None:
        self._m = matcher
        self._taken: list[bool] = []
        words, own = bitmask_words(vocab_size), bitmask_words(backend_vocab)
        self._scratch = None if own == words else np.zeros(own, np.int32)
        self._eos = tuple(eos_token_ids)
        self._next = np.zeros(words, np.int32)  # the look-ahead row of fast_forward
        self._next_valid = False
        self.failed: str | None = None

    def fill_bitmask(self, row: np.ndarray) -> None:
        if self._next_valid:
            row[:] = self._next
            self._next_valid = False
            return
        self._fill(row)

    def _fill(self, row: np.ndarray) -> None:
        if self.failed is None:
            try:
                if self._scratch is None:
                    self._m.fill_bitmask(row)
                else:
                    self._m.fill_bitmask(self._scratch)
                    row[:] = self._scratch[: len(row)]
            except Exception as exc:  # noqa: BLE001 - a matcher's failure ends its choice only
                log.warning("the grammar matcher failed (%s); ending the choice", exc)
                row[:] = 0
        else:
            row[:] = 0
        if not row.any():
            # nothing allowed would leave the sampler nothing to draw: end the choice
            words = row.view(np.uint32)
            for t in self._eos:
                words[t // 32] |= np.uint32(1 << (t % 32))

    def fast_forward(self, limit: int, allowed: Callable[[int], bool]) -> list[int]:
        """Accepts the tokens the grammar now forces, at most ``limit``, stopping at one
        that ``allowed`` refuses (the sampler would not draw it there); returns them."""
        forced: list[int] = []
        if self.failed is not None:
            return forced
        try:
            if self._m.is_terminated():  # the draw was its end-of-sequence token
                return forced
        except Exception as exc:  # noqa: BLE001 - ends this choice's request only
            self._fail("is_terminated", exc)
            return forced
        row = self._next
        while len(forced) < limit:
            self._fill(row)
            token = _single_token(row)
            if token is None or token in self._eos or not allowed(token):
                self._next_valid = True
                break
            self.accept(token)
            if self.failed is not None:
                break
            forced.append(token)
        return forced

    def accept(self, token_id: int) -> None:
        if self.failed is not None:
            return
        self._next_valid = False
        try:
            taken = self._m.accept(token_id)
        except Exception as exc:  # noqa: BLE001 - ends this choice's request only
            self._fail("accept", exc)
            return
        if not taken and token_id not in self._eos:
            log.warning("the grammar refused token %d; ending the choice", token_id)
        self._taken.append(taken)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0 or self.failed is not None:
            return
        self._next_valid = False
        undone = sum(self._taken[-num_tokens:])
        del self._taken[-num_tokens:]
        if undone:
            try:
                self._m.rollback(undone)
            except Exception as exc:  # noqa: BLE001 - ends this choice's request only
                self._fail("rollback", exc)

    def replay(self, token_ids: Iterable[int]) -> None:
        """Brings a fresh matcher to where a resumed sequence's outputs left it."""
        for t in token_ids:
            self.accept(int(t))
            if self.failed is not None:
                return

    def _fail(self, what: str, exc: Exception) -> None:
        log.warning("the grammar matcher's %s raised (%s: %s); ending the choice's request",
                    what, type(exc).__name__, exc)
        self.failed = f"the grammar matcher's {what} raised {type(exc).__name__}"
        self._next_valid = False


class EosOnlyMask:
    """The mask of a choice that no matcher could be built for: it lets the choice only
    end, and ``failed`` (why) ends the choice's request."""

    __slots__ = ("_row", "failed")

    def __init__(self, vocab_size: int, eos_token_ids: Iterable[int], failed: str) -> None:
        row = np.zeros(bitmask_words(vocab_size), np.uint32)
        for t in eos_token_ids:
            row[t // 32] |= np.uint32(1 << (t % 32))
        self._row = row.view(np.int32)
        self.failed = failed

    def fill_bitmask(self, row: np.ndarray) -> None:
        row[:] = self._row

    def fast_forward(self, limit: int, allowed: Callable[[int], bool]) -> list[int]:
        return []

    def accept(self, token_id: int) -> None:
        pass

    def rollback(self, num_tokens: int) -> None:
        pass


def _single_token(row: np.ndarray) -> int | None:
    """The one token a bitmask row allows, or None when it allows none or several."""
    words = row.view(np.uint32)
    nonzero = np.flatnonzero(words)
    if len(nonzero) != 1:
        return None
    w = int(nonzero[0])
    bits = int(words[w])
    if bits & (bits - 1):
        return None
    return w * 32 + bits.bit_length() - 1


def mask_for(get_matcher: Callable[[], tuple[Matcher, int]], vocab_size: int,
             eos_token_ids: tuple[int, ...], outputs: Iterable[int]
             ) -> MatcherMask | EosOnlyMask:
    """A choice's mask: ``get_matcher()`` returns (a fresh matcher, its backend's vocabulary
    size); ``outputs`` are the tokens the choice already holds (a resumed sequence). Never
    raises: a matcher that cannot be built or replayed gives a mask with ``failed`` set."""
    try:
        matcher, backend_vocab = get_matcher()
    except Exception as exc:  # noqa: BLE001 - must end the choice's request, not the step
        log.warning("structured output constraint unavailable in the engine: %s", exc)
        return EosOnlyMask(vocab_size, eos_token_ids,
                           failed=f"no grammar matcher: {type(exc).__name__}")
    if _accept_fault is not None:
        matcher = _FaultyAccept(matcher, _accept_fault)  # type: ignore[assignment]
    mask = MatcherMask(matcher, backend_vocab, vocab_size, eos_token_ids)
    mask.replay(outputs)
    return mask
