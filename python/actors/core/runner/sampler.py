"""Sampler: one step's sampling rows -> the core's columns -> one llmcore.sample call.

    SamplingRow per sequence --columns--> llmcore.sample --> SampledToken per sequence

Per-sequence state the sampler reads (``SeqState``: prompt and outputs for penalties, logit
bias, the allowed-token mask) lives on the runner; the rows carry the per-step values.
One core call samples every row; when the core refuses the batch, the rows are drawn one
by one and only the refused rows come back as ``SampledToken(refused=True)``. A draw
depends on its row, seed and position alone, so the other rows get the same tokens.

The seam for constrained decoding (structured outputs plug in here): a sequence may carry
``SamplingHooks``, registered on the runner per (request id, choice index):

- ``logits_processors``: callables ``(output token ids so far, logits row)`` that may
  change the row (a 1-D float tensor over the vocabulary) in place before sampling;
- ``token_mask``: an object with ``fill_bitmask(row)`` (called every step that samples:
  ``row`` is an int32 numpy array of ceil(vocab / 32) words, bit ``t % 32`` of word
  ``t // 32`` set means token t may be drawn; it arrives all ones, the object clears what
  it forbids or overwrites it), ``accept(token_id)`` after each draw, and
  ``rollback(num_tokens)`` when a sequence comes back (after preemption) holding fewer
  output tokens than the mask accepted. The mask is ANDed with ``allowed_token_ids``.
  Optionally ``fast_forward(limit, allowed)``: after a draw, accept and return the tokens
  the constraint now forces (each the only token the mask would allow, and ``allowed``);
  the sampler appends them to the draw (``SampledToken.forced``), so the choice skips the
  model steps that could only have drawn them. Rows that want logprobs or carry logits
  processors never fast-forward (both must see every position).

A mask whose ``accept`` or fast-forward raises, or that reports ``failed`` (a matcher that
cannot be trusted any more; ``SamplingHooks.failed`` when the runner could not build or
roll back the mask), cannot constrain the choice's next token: its row comes back refused,
so its request ends with "error" alone and the step goes on.

A step in which no sequence has hooks takes none of these paths (one boolean test).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import llmcore
import numpy as np
import torch

from actors.messages import Logprobs, SampledToken, SamplingRow

__all__ = ["LogitsProcessor", "Sampler", "SamplingHooks", "SeqState", "TokenMask",
           "allowed_mask_of"]

log = logging.getLogger("actors.core.runner.sampler")

# What building a row's int32/float32 columns or the core's own checks raise for a value
# the sampler cannot take: the step goes on without that row.
_REFUSED = (ValueError, OverflowError, TypeError)
_Draw = tuple[int, "Logprobs | None"]  # (token id, its logprobs when asked for)

LogitsProcessor = Callable[[Sequence[int], torch.Tensor], None]


class TokenMask(Protocol):
    def fill_bitmask(self, bitmask_row: np.ndarray) -> None: ...

    def accept(self, token_id: int) -> None: ...

    def rollback(self, num_tokens: int) -> None: ...


# Most tokens one draw may bring along by fast-forward (a bound on one step's growth).
FAST_FORWARD_LIMIT = 64


@dataclass(slots=True)
class SamplingHooks:
    """What constrains one choice's sampling beyond its SamplingParams. Stateful: each
    choice needs its own. ``accepted`` counts the tokens ``token_mask`` has accepted."""

    logits_processors: tuple[LogitsProcessor, ...] = ()
    token_mask: TokenMask | None = None
    accepted: int = 0
    failed: str | None = None  # why the constraint cannot be followed: the next draw is refused


@dataclass(slots=True)
class SeqState:
    """What the engine side remembers of one sequence between steps."""

    prompt: np.ndarray  # int32
    outputs: list[int]
    logit_bias: tuple[tuple[int, float], ...]
    allowed_mask: np.ndarray | None  # int32 bitmask row, or None
    output_array: np.ndarray | None = field(default=None)  # cache of outputs as int32
    hooks: SamplingHooks | None = None
    prompt_penalized: bool = True  # False: the prompt's ids are placeholders (embeddings)

    def outputs_i32(self) -> np.ndarray:
        if self.output_array is None or len(self.output_array) != len(self.outputs):
            self.output_array = np.asarray(self.outputs, dtype=np.int32)
        return self.output_array


def _broken(h: SamplingHooks) -> bool:
    """Whether the choice's constraint can no longer be followed (see the module's notes)."""
    return h.failed is not None or getattr(h.token_mask, "failed", None) is not None


def allowed_mask_of(token_ids: Sequence[int], vocab_size: int) -> np.ndarray:
    """The int32 bitmask row allowing exactly these tokens."""
    mask = np.zeros((vocab_size + 31) // 32, dtype=np.uint32)
    ids = np.asarray(token_ids, dtype=np.int64)
    np.bitwise_or.at(mask, ids // 32, (np.uint32(1) << (ids % 32).astype(np.uint32)))
    return mask.view(np.int32)


class Sampler:
    def __init__(self, vocab_size: int, fast_forward: bool = True) -> None:
        self.vocab_size = vocab_size
        self._bitmask_words = (vocab_size + 31) // 32
        self.fast_forward = fast_forward

    def sample(self, logits: torch.Tensor, rows: list[SamplingRow], seq_ids: list[int],
               states: list[SeqState], hooked: bool = False) -> list[SampledToken]:
        """One token per row (logits' rows, in order); appends it to the state's outputs.
        ``hooked``: some sequence of the runner carries SamplingHooks."""
        hook_mask = self._apply_hooks(logits, states) if hooked else None
        try:
            drawn: list[_Draw | None] = list(self._draw(logits, rows, states, hook_mask))
        except _REFUSED:
            # Some row holds a value the core refuses (validation should have caught it):
            # draw row by row so that only those rows fail.
            drawn = [self._draw_one(logits, j, rows, states, seq_ids, hook_mask)
                     for j in range(len(rows))]
        sampled = []
        for sid, row, st, d in zip(seq_ids, rows, states, drawn):
            h = st.hooks
            if d is None or (h is not None and _broken(h)):
                sampled.append(SampledToken(seq_id=sid, token_id=llmcore.NO_TOKEN, refused=True))
                continue
            before = len(st.outputs)
            st.outputs.append(d[0])
            forced: tuple[int, ...] = ()
            if h is not None and h.token_mask is not None and d[0] >= 0:
                try:
                    h.token_mask.accept(d[0])
                    h.accepted += 1
                    if self.fast_forward and not row.want_logprobs and not h.logits_processors:
                        forced = self._forced(row, st, h.token_mask)
                except Exception as exc:  # noqa: BLE001 - ends this choice's request only
                    log.warning("the token mask of sequence %d raised: %s", sid, exc)
                    h.failed = f"the token mask raised {type(exc).__name__}"
                if _broken(h):
                    del st.outputs[before:]
                    sampled.append(SampledToken(seq_id=sid, token_id=llmcore.NO_TOKEN,
                                                refused=True))
                    continue
            sampled.append(SampledToken(seq_id=sid, token_id=d[0], logprobs=d[1],
                                        forced=forced))
        return sampled

    @staticmethod
    def _forced(row: SamplingRow, st: SeqState, mask: TokenMask) -> tuple[int, ...]:
        ff = getattr(mask, "fast_forward", None)
        if ff is None:
            return ()
        banned = row.banned_token_ids
        allowed_words = None if st.allowed_mask is None else st.allowed_mask.view(np.uint32)

        def allowed(t: int) -> bool:
            # what the core would refuse to draw at this position stops the jump
            if t in banned:
                return False
            return allowed_words is None or bool((int(allowed_words[t // 32]) >> (t % 32)) & 1)

        forced = tuple(ff(FAST_FORWARD_LIMIT, allowed))
        if forced:
            st.outputs.extend(forced)
            assert st.hooks is not None
            st.hooks.accepted += len(forced)
        return forced

    def _apply_hooks(self, logits: torch.Tensor, states: list[SeqState]
                     ) -> tuple[np.ndarray, np.ndarray] | None:
        """Runs the logits processors in place; returns (bitmask, use) of the token masks."""
        mask = use = None
        for j, st in enumerate(states):
            h = st.hooks
            if h is None:
                continue
            if h.logits_processors:
                with torch.inference_mode():  # the logits are inference tensors
                    row = logits[j]
                    for proc in h.logits_processors:
                        proc(st.outputs, row)
            if h.token_mask is not None:
                if mask is None:
                    mask = np.full((len(states), self._bitmask_words), -1, dtype=np.int32)
                    use = np.zeros(len(states), dtype=np.int32)
                h.token_mask.fill_bitmask(mask[j])
                use[j] = 1
        return None if mask is None else (mask, use)

    def _draw_one(self, logits: torch.Tensor, j: int, rows: list[SamplingRow],
                  states: list[SeqState], seq_ids: list[int],
                  hook_mask: tuple[np.ndarray, np.ndarray] | None) -> _Draw | None:
        one = None if hook_mask is None else (hook_mask[0][j: j + 1], hook_mask[1][j: j + 1])
        try:
            return self._draw(logits[j: j + 1], rows[j: j + 1], states[j: j + 1], one)[0]
        except _REFUSED as exc:
            log.warning("the sampler refused the row of sequence %d: %s", seq_ids[j], exc)
            return None

    def _num_top(self, row: SamplingRow) -> int:
        if row.num_logprobs < 0:  # -1: all
            return self.vocab_size
        return min(row.num_logprobs, self.vocab_size)  # a beam's 2 * width may exceed it

    def _draw(self, logits: torch.Tensor, rows: list[SamplingRow], states: list[SeqState],
              hook_mask: tuple[np.ndarray, np.ndarray] | None = None) -> list[_Draw]:
        """One core call for these rows (logits' rows, in order); changes no state."""
        n = len(rows)
        f32 = np.float32
        temperature = np.fromiter((r.temperature for r in rows), f32, n)
        top_k = np.fromiter((r.top_k for r in rows), np.int32, n)
        top_p = np.fromiter((r.top_p for r in rows), f32, n)
        min_p = np.fromiter((r.min_p for r in rows), f32, n)
        rep = np.fromiter((r.repetition_penalty for r in rows), f32, n)
        pres = np.fromiter((r.presence_penalty for r in rows), f32, n)
        freq = np.fromiter((r.frequency_penalty for r in rows), f32, n)
        seed = np.fromiter((r.seed for r in rows), np.uint64, n)
        position = np.fromiter((r.position for r in rows), np.int64, n)

        kwargs = {}
        if any(r.uses_penalties for r in rows):
            kwargs["prompt_tokens"] = _csr([
                st.prompt if r.repetition_penalty != 1.0 and st.prompt_penalized else None
                for r, st in zip(rows, states)])
            kwargs["output_tokens"] = _csr([st.outputs_i32() if r.uses_penalties else None
                                            for r, st in zip(rows, states)])
        if any(st.logit_bias for st in states):
            kwargs["logit_bias"] = _csr_bias([st.logit_bias for st in states])
        if any(r.banned_token_ids for r in rows):
            kwargs["banned_tokens"] = _csr([np.asarray(r.banned_token_ids, dtype=np.int32)
                                            for r in rows])
        mask, use = hook_mask if hook_mask is not None else (None, None)
        if any(st.allowed_mask is not None for st in states):
            if mask is None:
                mask = np.full((n, self._bitmask_words), -1, dtype=np.int32)
                use = np.zeros(n, dtype=np.int32)
            for j, st in enumerate(states):
                if st.allowed_mask is not None:
                    mask[j] &= st.allowed_mask
                    use[j] = 1
        if mask is not None:
            kwargs["allowed_bitmask"] = mask
            kwargs["use_bitmask"] = use
        # Any count up to the vocabulary; the core refuses a row beyond it like any other.
        num_top = max((self._num_top(r) for r in rows if r.want_logprobs), default=0)
        listed = None
        if any(r.logprob_token_ids for r in rows):
            listed = _csr([np.asarray(r.logprob_token_ids, dtype=np.int32) for r in rows])
            kwargs["logprob_token_ids"] = listed

        res = llmcore.sample(logits, temperature, top_k, top_p, min_p, rep, pres, freq, seed,
                             position, num_top_logprobs=num_top, **kwargs)
        tokens, logprobs, _ranks, top_tokens, top_logprobs, listed_logprobs = res
        out: list[_Draw] = []
        for j, r in enumerate(rows):
            lp = None
            if r.logprob_token_ids:
                assert listed is not None
                at = listed[0][j]
                lp = Logprobs(
                    logprob=float(logprobs[j]),
                    top_token_ids=r.logprob_token_ids,
                    top_logprobs=tuple(float(x) for x in
                                       listed_logprobs[at: at + len(r.logprob_token_ids)]),
                )
            elif r.want_logprobs:
                k = self._num_top(r)
                lp = Logprobs(
                    logprob=float(logprobs[j]),
                    top_token_ids=tuple(int(t) for t in top_tokens[j, :k]),
                    top_logprobs=tuple(float(x) for x in top_logprobs[j, :k]),
                )
            out.append((int(tokens[j]), lp))
        return out


def _csr(lists: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, tokens) for per-row int32 token lists; None is an empty row."""
    lengths = np.fromiter((0 if x is None else len(x) for x in lists), np.int32, len(lists))
    offsets = np.zeros(len(lists) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    parts = [x for x in lists if x is not None and len(x)]
    tokens = np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, dtype=np.int32)
    return offsets, tokens


def _csr_bias(biases: list[tuple[tuple[int, float], ...]]):
    offsets = np.zeros(len(biases) + 1, dtype=np.int32)
    np.cumsum([len(b) for b in biases], out=offsets[1:])
    toks = np.fromiter((t for b in biases for t, _ in b), np.int32)
    vals = np.fromiter((v for b in biases for _, v in b), np.float32)
    return offsets, toks, vals
