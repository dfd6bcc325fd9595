"""The model's attention seams for one step of ``ModelRunner``: what each attention layer
calls. ``PagedAttention`` stores the step's new K/V in the paged cache and attends over it
(a decoder); ``CrossPagedAttention`` adds an encoder-decoder's cross-attention over each
sequence's encoder K/V; ``EncoderAttention`` is an encoder's bidirectional attention over
each sequence's own rows, with nothing cached.
"""

from __future__ import annotations

import llmcore
import numpy as np
import torch

from actors.core.runner.cross_kv import CrossKVPool

__all__ = ["CrossPagedAttention", "EncoderAttention", "PagedAttention"]


class PagedAttention:
    """The model's attention seam for one step: store new K/V, attend over the cache."""

    __slots__ = ("k_caches", "plan", "scale", "v_caches", "windows")

    def __init__(self, plan, k_caches, v_caches, scale: float, windows: list[int]) -> None:
        self.plan = plan
        self.k_caches = k_caches
        self.v_caches = v_caches
        self.scale = scale
        self.windows = windows

    def attn(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kc, vc = self.k_caches[layer], self.v_caches[layer]
        llmcore.kv_store(self.plan, k, v, kc, vc)
        out = torch.empty_like(q)
        llmcore.paged_attention(self.plan, q, kc, vc, out, self.scale,
                                sliding_window=self.windows[layer])
        return out


class CrossPagedAttention(PagedAttention):
    """The paged seam of an encoder-decoder's decoder (Whisper), with cross-attention:
    each row attends over its own sequence's encoder K/V (CrossKVPool: computed once, on
    the sequence's first step), unmasked and without writing; one core call a layer."""

    __slots__ = ("cross_plan", "pool")

    def __init__(self, plan, k_caches, v_caches, scale: float, windows: list[int],
                 pool: CrossKVPool, row_seq_ids: np.ndarray) -> None:
        super().__init__(plan, k_caches, v_caches, scale, windows)
        self.pool = pool
        self.cross_plan = pool.plan(row_seq_ids.tolist())

    def cross_attn(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(q)
        llmcore.paged_attention(self.cross_plan, q, self.pool.k[layer], self.pool.v[layer],
                                out, self.scale)
        return out


class EncoderAttention:
    """The attention seam of an encoder (bidirectional, ``model.is_causal`` False): each
    sequence's rows attend to all of its rows, and nothing is cached (every prompt runs
    whole in one step). The batch is padded to its longest sequence once per step and
    every layer runs one SDPA call with a key mask."""

    __slots__ = ("cols", "mask", "rows", "scale", "shape")

    def __init__(self, query_start: np.ndarray, scale: float) -> None:
        lens = np.diff(query_start)
        b, width = len(lens), int(lens.max())
        owner = np.repeat(np.arange(b), lens)
        self.rows = torch.from_numpy(owner)
        self.cols = torch.from_numpy(np.arange(int(query_start[-1])) - query_start[owner])
        self.shape = (b, width)
        self.mask = (torch.arange(width)[None, :] < torch.from_numpy(lens)[:, None])[:, None, None]
        self.scale = scale

    def attn(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, width = self.shape

        def padded(x: torch.Tensor) -> torch.Tensor:
            out = x.new_zeros((b, width, *x.shape[1:]))
            out[self.rows, self.cols] = x
            return out.transpose(1, 2)  # [b, heads, width, head_size]

        out = torch.nn.functional.scaled_dot_product_attention(
            padded(q), padded(k), padded(v), attn_mask=self.mask, scale=self.scale)
        return out.transpose(1, 2)[self.rows, self.cols]
