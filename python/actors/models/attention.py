"""The attention seam between the model and whoever owns the KV cache.

The model computes q/k/v for every token of the flattened batch and hands them to an
``AttentionBackend``; the backend knows the per-step metadata (which rows belong to which
sequence, where their KV blocks live) and returns the attention output. The model itself
never sees sequence boundaries.

    rows of the flattened batch:  | seq 0 (3 tokens) | seq 1 (1 token) | seq 2 (4 tokens) |
    positions:                      5 6 7              12                0 1 2 3

Each layer's attention is described by a ``LayerAttentionSpec`` (a model lists them in
``attention_specs()``, one per layer): its heads, its softmax scale (not always
1/sqrt(head_size): Gemma scales by query_pre_attn_scalar**-0.5, Granite by an attention
multiplier), its sliding window and its logit softcap (Gemma 2: logits become
softcap * tanh(logits / softcap) before the mask and softmax). The runner passes all three
to the core per layer; the KV manager frees what the windows no longer reach.

``DenseCausalAttention`` is the cache-free backend for whole-sequence prefill (each sequence
starts at position 0): the reference the paged backend is checked against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class LayerAttentionSpec:
    """What a backend must know about one layer's attention."""

    num_heads: int
    num_kv_heads: int
    head_size: int
    scale: float
    sliding_window: int | None  # keys at positions p - window + 1 .. p are visible to p
    softcap: float | None = None  # logits -> softcap * tanh(logits / softcap); None: none


class AttentionBackend(Protocol):
    def attn(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """q [T, num_heads, head_size], k/v [T, num_kv_heads, head_size]
        -> out [T, num_heads, head_size].

        Stores k/v for the batch's tokens (if the backend has a cache) and attends each
        query over its own sequence's keys up to and including its position. q/k/v may be
        views of a buffer the model reuses once the call returns: a backend that keeps them
        must copy.
        """
        ...


class DenseCausalAttention:
    """Causal attention over whole sequences laid end to end, without a KV cache."""

    def __init__(self, specs: Sequence[LayerAttentionSpec], seq_lens: Sequence[int]) -> None:
        self.specs = list(specs)
        self.seq_lens = [int(n) for n in seq_lens]
        self._masks: dict[tuple[int, int | None], torch.Tensor] = {}

    def attn(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        spec = self.specs[layer_idx]
        if q.shape[0] != sum(self.seq_lens):
            raise ValueError(f"batch has {q.shape[0]} rows, seq_lens sum to {sum(self.seq_lens)}")
        group = spec.num_heads // spec.num_kv_heads
        out = torch.empty_like(q)
        start = 0
        for n in self.seq_lens:
            sl = slice(start, start + n)
            # SDPA wants [1, heads, T, D]: CPU SDPA takes its flash kernel only for 4-D
            # inputs and without enable_gqa (6x faster than the math path at 1.5k tokens),
            # so KV heads are repeated for their query group here.
            qh, kh, vh = (x[sl].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
            if group > 1:
                kh, vh = kh.repeat_interleave(group, 1), vh.repeat_interleave(group, 1)
            if spec.softcap:
                o = _softcapped(qh, kh, vh, spec, n)
            else:
                mask = self._window_mask(n, spec.sliding_window, q.device)
                o = F.scaled_dot_product_attention(
                    qh, kh, vh, attn_mask=mask, is_causal=mask is None, scale=spec.scale
                )
            out[sl] = o[0].transpose(0, 1)
            start += n
        return out

    def _window_mask(self, n: int, window: int | None, device: torch.device) -> torch.Tensor | None:
        if window is None or window >= n:
            return None
        key = (n, window)
        if key not in self._masks:
            i = torch.arange(n, device=device)
            diff = i[:, None] - i[None, :]
            self._masks[key] = (diff >= 0) & (diff < window)
        return self._masks[key]


def _softcapped(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: LayerAttentionSpec, n: int
) -> torch.Tensor:
    """Attention with capped logits ([1, heads, n, head_size] each): SDPA has no softcap,
    so the logits are formed, capped, masked (causal, then the window) and normalized in
    float32 here."""
    cap = float(spec.softcap or 0.0)
    logits = (q.float() @ k.float().transpose(-1, -2)) * spec.scale
    logits = cap * torch.tanh(logits / cap)
    i = torch.arange(n, device=q.device)
    diff = i[:, None] - i[None, :]
    visible = diff >= 0
    if spec.sliding_window is not None:
        visible &= diff < spec.sliding_window
    logits = logits.masked_fill(~visible, float("-inf"))
    return (torch.softmax(logits, dim=-1) @ v.float()).to(q.dtype)
