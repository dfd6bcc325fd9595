"""A plain torch reference of the sampler's processing pipeline: the test oracle.

One row at a time, written for clarity, in the order of the compiled sampler (and vLLM v1):
logit bias -> banned tokens -> allowed tokens -> repetition penalty (prompt + output) ->
frequency / presence penalties (output) -> temperature -> min-p -> top-k -> top-p.
Probabilities are computed in float64 so the reference is the exact target distribution.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

__all__ = ["RefRow", "RefResult", "reference_row"]


@dataclass(frozen=True)
class RefRow:
    """One row's sampling parameters (same meaning as ``SamplingBatch.add``)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    prompt_tokens: tuple[int, ...] = ()
    output_tokens: tuple[int, ...] = ()
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    banned_tokens: tuple[int, ...] = ()
    allowed_tokens: Iterable[int] | None = None


@dataclass(frozen=True)
class RefResult:
    """The reference outcome for one row.

    raw_logprobs: log_softmax of the logits as given (NaN treated as masked).
    processed_logprobs: log_softmax after bias, masks, penalties and temperature (greedy: T = 1).
    probs: the final distribution the draw samples from (float64; one-hot when greedy,
        all zero when every token is masked).
    greedy_token: argmax of the processed logits (lowest id on ties), -1 when all are masked.
    """

    raw_logprobs: torch.Tensor
    processed_logprobs: torch.Tensor
    probs: torch.Tensor
    greedy_token: int


def _sanitize(x: torch.Tensor) -> torch.Tensor:
    x = torch.where(torch.isnan(x), torch.full_like(x, -torch.inf), x)
    return x.clamp(max=torch.finfo(torch.float32).max)


def _log_softmax(x: torch.Tensor) -> torch.Tensor:
    if not bool(torch.isfinite(x).any()):
        return torch.full_like(x, -torch.inf)
    return torch.log_softmax(x, dim=-1)


def _process(x: torch.Tensor, p: RefRow) -> torch.Tensor:
    vocab = x.numel()
    for token, value in p.logit_bias.items():
        x[token] += value
    if p.banned_tokens:
        x[list(p.banned_tokens)] = -torch.inf
    if p.allowed_tokens is not None:
        blocked = torch.ones(vocab, dtype=torch.bool)
        blocked[list(p.allowed_tokens)] = False
        x[blocked] = -torch.inf
    seen = sorted(set(p.prompt_tokens) | set(p.output_tokens))
    if seen and p.repetition_penalty != 1.0:
        v = x[seen]
        x[seen] = torch.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
    counts = torch.bincount(torch.tensor(p.output_tokens, dtype=torch.long), minlength=vocab)
    x = x - p.frequency_penalty * counts.to(x.dtype)
    return x - p.presence_penalty * (counts > 0).to(x.dtype)


def _filter(s: torch.Tensor, p: RefRow) -> torch.Tensor:
    """min-p, top-k, top-p on scaled logits s (float64); returns the final distribution."""
    probs = torch.softmax(s, dim=-1)
    if p.min_p > 0:
        s = s.masked_fill(probs < p.min_p * probs.max(), -torch.inf)
    if 0 < p.top_k < s.numel():
        kth = torch.topk(s, p.top_k).values[-1]
        s = s.masked_fill(s < kth, -torch.inf)
    if p.top_p < 1:
        probs = torch.softmax(s, dim=-1)
        # Stable descending sort: equal probabilities keep the lower id first.
        order = torch.sort(-probs, stable=True).indices
        sorted_probs = probs[order]
        before = torch.cumsum(sorted_probs, 0) - sorted_probs
        drop = before >= p.top_p * sorted_probs.sum()
        drop[0] = False
        s = s.clone()
        s[order[drop]] = -torch.inf
    return torch.softmax(s, dim=-1)


def reference_row(logits: torch.Tensor, p: RefRow) -> RefResult:
    """Runs the pipeline on one row of logits (1-D; any float dtype, computed in float32)."""
    raw = _sanitize(logits.detach().to(torch.float32).flatten().clone())
    x = _sanitize(_process(raw.clone(), p))
    greedy = not p.temperature > 0
    if not greedy:
        x = _sanitize(x / p.temperature)
    processed = _log_softmax(x)
    any_left = bool(torch.isfinite(x).any())
    greedy_token = int(torch.argmax(x)) if any_left else -1
    if not any_left:
        probs = torch.zeros(x.numel(), dtype=torch.float64)
    elif greedy:
        probs = torch.zeros(x.numel(), dtype=torch.float64)
        probs[greedy_token] = 1.0
    else:
        probs = _filter(x.to(torch.float64), p)
    return RefResult(_log_softmax(raw), processed, probs, greedy_token)
