"""A choice's token mask under a ``ReasoningGate``: ``GatedMask``.

The runner builds one for a choice whose params carry a gate (``SamplingParams.
reasoning_gate``; a choice without one never meets this module), around the choice's
grammar mask when it has a constraint (``inner``, a ``MatcherMask``) or around nothing
when it only has a thinking budget. It follows the choice's tokens through two phases:

- reasoning: the grammar is neither consulted nor fed (unless ``constrain_reasoning``);
  the row stays as it came (all tokens), except past the budget, where it allows only the
  end marker's next token. The end marker's tokens, drawn or forced, end the phase; the
  start marker's tokens reset the budget's count (it counts one stretch of reasoning, from
  the output's start or the last start marker, as vLLM 0.34 counts it);
- content: the grammar binds, starting from its initial state with the first token after
  the end marker. Without a grammar (a budget alone), or with ``constrain_reasoning``, the
  start marker opens reasoning again, as the server's parsers read it; with a grammar
  binding only the content, content is final.

Markers are matched as token sequences: the tokenizer's encoding of the marker text. A
model that spells a marker with other tokens is not seen to cross it here (its text parser
still splits it); the markers of real reasoning models are single special tokens. A forced
token the request's own `allowed_token_ids` rules out leaves the row empty, which ends the
choice with "stop" (the core's answer to a row with nothing allowed).

The budget's forced token is the next one of the end marker after the longest part of it
the reasoning already ends with; ``fast_forward`` takes the forced tokens at once (they
are the only ones the mask allows), then the grammar's own forced tokens in content. Each
accepted token is logged with the phase before it and whether the grammar took it, so
``rollback(n)`` restores the phase and rolls the grammar back by exactly the tokens it
took; ``replay`` brings a fresh gate to where a resumed sequence's outputs left it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from actors.params.reasoning import ReasoningGate

__all__ = ["GatedMask"]


class GatedMask:
    """``sampler.TokenMask`` of one choice under a reasoning gate (see the module's notes).
    ``inner``: the choice's grammar mask, None for a budget alone."""

    __slots__ = ("_count", "_gate", "_inner", "_log", "_reasoning", "_tokens")

    def __init__(self, gate: ReasoningGate, inner: Any | None) -> None:
        self._gate = gate
        self._inner = inner
        self._reasoning = gate.in_reasoning
        self._count = 0  # tokens of the current phase (of this stretch of reasoning)
        self._tokens: list[int] = []
        self._log: list[tuple[bool, int, bool]] = []  # per token: phase, count, fed

    @property
    def failed(self) -> str | None:
        return getattr(self._inner, "failed", None)

    @property
    def in_reasoning(self) -> bool:
        return self._reasoning

    def _binds(self) -> bool:
        """Whether the grammar constrains (and is fed) the next token."""
        return self._inner is not None and (not self._reasoning
                                            or self._gate.constrain_reasoning)

    def _ends_with(self, marker: tuple[int, ...]) -> bool:
        n = len(marker)
        return 0 < n <= self._count and tuple(self._tokens[-n:]) == marker

    def forced(self) -> int | None:
        """The end-marker token the budget forces next; None when it forces nothing."""
        budget = self._gate.thinking_token_budget
        if not self._reasoning or budget is None or self._count < budget:
            return None
        end = self._gate.end_token_ids
        for k in range(min(len(end) - 1, self._count), 0, -1):
            if tuple(self._tokens[-k:]) == end[:k]:
                return end[k]
        return end[0]

    # -- TokenMask ------------------------------------------------------------------------

    def fill_bitmask(self, row: np.ndarray) -> None:
        forced = self.forced()
        if forced is not None:
            if self._binds():  # constrain_reasoning: the grammar has the last word
                self._inner.fill_bitmask(row)
                words = row.view(np.uint32)
                if not (int(words[forced // 32]) >> (forced % 32)) & 1:
                    return
            row[:] = 0
            row.view(np.uint32)[forced // 32] = np.uint32(1 << (forced % 32))
        elif self._binds():
            self._inner.fill_bitmask(row)
        # reasoning, or content without a grammar: the row stays as it came (all tokens)

    def accept(self, token_id: int) -> None:
        fed = self._binds()
        if fed:
            self._inner.accept(token_id)
        self._note(token_id, fed)

    def _note(self, token_id: int, fed: bool) -> None:
        """Logs a token (fed: the grammar took it) and moves the phase on."""
        self._log.append((self._reasoning, self._count, fed))
        self._tokens.append(token_id)
        self._count += 1
        gate = self._gate
        if self._reasoning:
            if self._ends_with(gate.end_token_ids):
                self._reasoning, self._count = False, 0
            elif self._ends_with(gate.start_token_ids):
                self._count = 0
        elif ((self._inner is None or gate.constrain_reasoning)
              and self._ends_with(gate.start_token_ids)):
            self._reasoning, self._count = True, 0

    def fast_forward(self, limit: int, allowed: Callable[[int], bool]) -> list[int]:
        """The budget's forced tokens, then in content the grammar's, at most ``limit``,
        stopping at one ``allowed`` refuses; accepted here."""
        out: list[int] = []
        while len(out) < limit and self.failed is None:
            forced = self.forced()
            if forced is not None and not self._binds():
                if not allowed(forced):
                    break
                self.accept(forced)
                out.append(forced)
                continue
            inner_ff = getattr(self._inner, "fast_forward", None)
            if forced is None and self._binds() and inner_ff is not None:
                more = inner_ff(limit - len(out), allowed)
                for t in more:
                    self._note(t, True)
                out.extend(more)
            break
        return out

    def rollback(self, num_tokens: int) -> None:
        n = min(num_tokens, len(self._log))
        if n <= 0:
            return
        undone = self._log[-n:]
        self._reasoning, self._count, _ = undone[0]
        fed = sum(1 for _, _, f in undone if f)
        del self._log[-n:]
        del self._tokens[-n:]
        if fed:
            self._inner.rollback(fed)

    def replay(self, token_ids: Iterable[int]) -> None:
        """Brings a fresh gate (and its fresh grammar) to where these outputs left it."""
        for t in token_ids:
            self.accept(int(t))
            if self.failed is not None:
                return
