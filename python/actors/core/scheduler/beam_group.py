"""BeamGroup: the bookkeeping of one beam-search request (scores, candidates, hypotheses).

The search is vLLM's (vllm/entrypoints/generate/beam_search/online.py), run by the engine
instead of the front end:

- each live beam yields its 2 * width most likely next tokens under the model's raw
  distribution (the sampler's top logprobs of a greedy row);
- a candidate that is an EOS id (unless ignore_eos) becomes a finished hypothesis at once,
  whatever its rank; the others compete on cumulative logprob and the best ``width`` of
  them are the next step's beams;
- the search ends when the beams reach the length limit (max_tokens, or the context) or
  none is left; the answer is the best ``width`` of the finished hypotheses and the last
  beams, by ``cum_logprob / max(generated, 1) ** length_penalty``, where ``generated``
  counts a final EOS.

No early stop: like vLLM's, the search runs to the limit even when no live beam can
overtake the finished hypotheses any more. Only the ``width`` best finished hypotheses are
kept (a finished score never changes, so the rest can never be returned).

This class holds numbers and token ids only; ``beam_book`` turns its choices into forked,
extended and freed sequences. A step costs O(width^2) Python: width beams times 2 * width
candidates.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from actors.messages import Logprobs

__all__ = ["BeamGroup", "Extension", "Hypothesis"]


@dataclass(frozen=True, slots=True)
class Hypothesis:
    """A finished beam as it will be reported."""

    token_ids: tuple[int, ...]  # a final EOS only with include_stop_str_in_output
    logprobs: tuple[Logprobs, ...]  # one per reported token (empty unless asked for)
    cum_logprob: float
    num_generated: int  # what the length penalty divides by: a final EOS counts
    finish_reason: str  # "stop" (EOS) or "length"
    stop_reason: int | None  # the EOS id that ended it

    def score(self, length_penalty: float) -> float:
        return self.cum_logprob / (max(self.num_generated, 1) ** length_penalty)


@dataclass(frozen=True, slots=True)
class Extension:
    """One of the next step's beams: live beam ``parent`` (its position in ``live``) plus
    ``token_id``."""

    parent: int
    token_id: int
    cum_logprob: float
    logprob: Logprobs | None  # its entry when logprobs are reported


class BeamGroup:
    def __init__(self, request_id: str, width: int, *, length_penalty: float,
                 eos_token_ids: frozenset[int], include_stop: bool,
                 num_logprobs: int | None, max_generated: int) -> None:
        """``eos_token_ids``: what ends a beam (empty under ignore_eos); ``num_logprobs``:
        alternatives reported per token (None: no logprobs); ``max_generated``: the length
        limit in generated tokens."""
        self.request_id = request_id
        self.width = width
        self.length_penalty = length_penalty
        self.eos = eos_token_ids
        self.include_stop = include_stop
        self.num_logprobs = num_logprobs
        self.max_generated = max_generated
        self.num_candidates = 2 * width  # per beam and step, as vLLM asks for
        # Per live beam (by sequence id): cumulative logprob and reported logprobs so far.
        self.cum: dict[int, float] = {}
        self.entries: dict[int, tuple[Logprobs, ...]] = {}
        self.pending: dict[int, Logprobs] = {}  # this step's candidates, per beam reported
        self.finished: list[Hypothesis] = []  # the best `width`, best first

    # ------------------------------------------------------------------ one step

    def report(self, seq_id: int, top: Logprobs, num_live: int) -> bool:
        """Records a live beam's candidates for the current step (a beam recomputed after
        preemption reports again: the latest wins); True once all ``num_live`` have."""
        self.pending[seq_id] = top
        return len(self.pending) >= num_live

    def extend(self, live: list[tuple[int, tuple[int, ...]]]) -> list[Extension]:
        """The next step's beams from the reported candidates of ``live`` ((seq id, output
        tokens so far) per beam, all of one length), best first. EOS candidates join the
        finished hypotheses; when the next length reaches the limit the extensions finish
        too and nothing is returned."""
        cands: list[tuple[float, int, int, int, int]] = []  # (cum, -beam, -rank, token, beam)
        for b, (sid, tokens) in enumerate(live):
            top, base = self.pending[sid], self.cum[sid]
            for rank, (tok, lp) in enumerate(zip(top.top_token_ids[: self.num_candidates],
                                                 top.top_logprobs)):
                if tok < 0 or not math.isfinite(lp):
                    continue  # fewer tokens than asked for, or an impossible one
                if tok in self.eos:
                    self._finish(sid, tokens, top, rank, tok, base + lp, "stop")
                else:
                    cands.append((base + lp, -b, -rank, tok, b))
        best = heapq.nlargest(self.width, cands)
        exts = [Extension(b, tok, c, self._entry(self.pending[live[b][0]], -neg_rank, tok))
                for c, _, neg_rank, tok, b in best]
        self.pending.clear()
        if exts and len(live[0][1]) + 1 >= self.max_generated:
            for e in exts:
                sid, tokens = live[e.parent]
                self._add(Hypothesis(
                    (*tokens, e.token_id), self._with(sid, e.logprob), e.cum_logprob,
                    len(tokens) + 1, "length", None))
            return []
        return exts

    def adopt(self, seq_id: int, parent_id: int, ext: Extension) -> None:
        """Sequence ``seq_id`` now holds ``ext`` (the parent's own id when it goes on)."""
        self.cum[seq_id] = ext.cum_logprob
        if self.num_logprobs is not None:
            self.entries[seq_id] = self._with(parent_id, ext.logprob)

    def forget(self, seq_id: int) -> None:
        self.cum.pop(seq_id, None)
        self.entries.pop(seq_id, None)
        self.pending.pop(seq_id, None)

    def results(self) -> list[Hypothesis]:
        """The answer, best first (at most ``width``): the finished hypotheses here."""
        return list(self.finished)

    # ------------------------------------------------------------------ internals

    def _finish(self, sid: int, tokens: tuple[int, ...], top: Logprobs, rank: int,
                eos: int, cum: float, reason: str) -> None:
        if self.include_stop:
            out, lps = (*tokens, eos), self._with(sid, self._entry(top, rank, eos))
        else:
            out, lps = tokens, self.entries.get(sid, ())
        self._add(Hypothesis(out, lps, cum, len(tokens) + 1, reason, eos))

    def _add(self, hyp: Hypothesis) -> None:
        """Keeps the best ``width`` (ties: the earlier one first, as a stable sort)."""
        fin = self.finished
        lp = self.length_penalty
        if len(fin) == self.width and hyp.score(lp) <= fin[-1].score(lp):
            return
        fin.append(hyp)
        fin.sort(key=lambda h: -h.score(lp))
        del fin[self.width:]

    def _entry(self, top: Logprobs, rank: int, token: int) -> Logprobs | None:
        if self.num_logprobs is None:
            return None
        k = None if self.num_logprobs < 0 else self.num_logprobs  # -1: every one there is
        return Logprobs(top.top_logprobs[rank], top.top_token_ids[:k], top.top_logprobs[:k],
                        rank + 1)

    def _with(self, sid: int, entry: Logprobs | None) -> tuple[Logprobs, ...]:
        if entry is None:
            return ()
        return (*self.entries.get(sid, ()), entry)
