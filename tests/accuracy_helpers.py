"""Accuracy measures the tests share: a model's logits over one text, their agreement with
a reference's, and the word error rate of a transcript."""

from __future__ import annotations

import re
from typing import Any

import torch


def logits_of(loaded: Any, ids: list[int]) -> torch.Tensor:
    """float32 logits of every position of `ids`, the whole text in one dense pass."""
    from actors.models.attention import DenseCausalAttention

    model = loaded.model
    attn = DenseCausalAttention(model.attention_specs(), [len(ids)])
    with torch.inference_mode():
        return model(torch.tensor(ids), torch.arange(len(ids)), attn).float()


def accuracy(got: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """The largest logit difference and the share of positions whose top token agrees."""
    return {"max_abs": float((got - ref).abs().max()),
            "top1": float((got.argmax(-1) == ref.argmax(-1)).float().mean())}


def word_error_rate(ref: str, hyp: str) -> float:
    """(substitutions + deletions + insertions) / reference words, on lower-cased words
    without punctuation."""
    r, h = (re.findall(r"[\w']+", s.lower()) for s in (ref, hyp))
    d = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        prev, d[0] = d[0], i
        for j, hw in enumerate(h, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (rw != hw))
    return d[len(h)] / len(r)
