"""The model's attention seams for one step of ``ModelRunner``: what each attention layer
calls. ``PagedAttention`` stores the step's new K/V in the paged cache and attends over it
(a decoder); ``CrossPagedAttention`` adds an encoder-decoder's cross-attention over each
sequence's encoder K/V; ``EncoderAttention`` is an encoder's bidirectional attention over
each sequence's own rows, with nothing cached.

Each layer attends with its own facts (``LayerAttention``: scale, sliding window, logit
softcap), read once from the model's ``attention_specs()``; a model without them (Bert,
the fallback) gets 1/sqrt(head_size), the config's windows and no softcap. Where a
layer's KV lives follows the KV cache groups (actors.core.kv_groups): the step has one core
plan per group (``group_plans``: that group's block tables and slots), and layer l stores
into and reads the slot tensor ``slot_of[l]`` through the plan of its group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import llmcore
import numpy as np
import torch

from actors.core.kv_groups import KVGroups
from actors.core.runner.cross_kv import CrossKVPool

__all__ = ["CrossPagedAttention", "EncoderAttention", "LayerAttention", "PagedAttention",
           "group_plans"]


@dataclass(frozen=True, slots=True)
class LayerAttention:
    """Per layer: the core's attention arguments and where the layer's KV lives."""

    scales: tuple[float, ...]
    windows: tuple[int, ...]  # 0: full causal attention
    softcaps: tuple[float, ...]  # 0.0: no softcap
    group_of: tuple[int, ...]  # the KV cache group whose plan the layer uses
    slot_of: tuple[int, ...]  # the cache tensor its K/V live in
    default_scale: float  # 1/sqrt(head_size): cross-attention and encoders

    @classmethod
    def of(cls, model, num_layers: int, head_size: int,
           sliding_windows: Sequence[int | None] = (),
           groups: KVGroups | None = None) -> LayerAttention:
        """Reads the model's ``attention_specs()`` when it has them; checks that no KV
        cache group frees blocks a layer's window still reads."""
        default = 1.0 / math.sqrt(head_size)
        specs = model.attention_specs() if hasattr(model, "attention_specs") else None
        if specs is not None:
            if len(specs) != num_layers:
                raise ValueError(f"the model lists {len(specs)} attention specs for "
                                 f"{num_layers} layers")
            scales = tuple(float(s.scale) for s in specs)
            windows = tuple(int(s.sliding_window or 0) for s in specs)
            softcaps = tuple(float(s.softcap or 0.0) for s in specs)
        else:
            scales = (default,) * num_layers
            windows = tuple(int(w or 0) for w in sliding_windows) or (0,) * num_layers
            softcaps = (0.0,) * num_layers
        groups = groups or KVGroups.single(num_layers)
        group_of, slot_of = tuple(groups.group_of()), tuple(groups.slot_of())
        if len(group_of) != num_layers:
            raise ValueError(f"the KV cache groups cover {len(group_of)} layers, the model "
                             f"has {num_layers}")
        for layer, w in enumerate(windows):
            freed_by = groups.windows[group_of[layer]]
            if freed_by is not None and freed_by != w:
                raise ValueError(f"layer {layer} attends over a window of {w or 'all'} "
                                 f"positions but its KV group frees beyond {freed_by}")
        return cls(scales, windows, softcaps, group_of, slot_of, default)


def group_plans(tables: np.ndarray, query_start: np.ndarray, seq_lens: np.ndarray,
                owner: np.ndarray, pos: np.ndarray, block_size: int,
                num_blocks: int) -> list[llmcore.AttentionPlan]:
    """One core plan per KV cache group from its block tables ``tables[g]`` [num_seqs,
    max_blocks]. A freed entry (-1, a sliding group's block behind every window) becomes
    block 0: the core checks the ids a sequence's length spans, and the kernels read no
    position before a query's window."""
    np.maximum(tables, 0, out=tables)
    plans = []
    for table in tables:
        slots = table[owner, pos // block_size].astype(np.int64) * block_size + pos % block_size
        plans.append(llmcore.AttentionPlan(query_start, seq_lens, table, slots,
                                           num_blocks=num_blocks))
    return plans


class PagedAttention:
    """The model's attention seam for one step: store new K/V, attend over the cache.

    The core's attention gives a query row the same bits whatever else the call holds
    (csrc/src/attention/attention_cpu.cpp), so the step's own plan serves the batch-invariant mode
    too."""

    __slots__ = ("k_caches", "layers", "plans", "v_caches")

    def __init__(self, plans: list, k_caches, v_caches, layers: LayerAttention) -> None:
        self.plans = plans  # per KV cache group
        self.k_caches = k_caches  # per slot
        self.v_caches = v_caches
        self.layers = layers

    def attn(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        la = self.layers
        group = la.group_of[layer]
        slot = la.slot_of[layer]
        kc, vc = self.k_caches[slot], self.v_caches[slot]
        llmcore.kv_store(self.plans[group], k, v, kc, vc)
        out = torch.empty_like(q)
        llmcore.paged_attention(self.plans[group], q, kc, vc, out, la.scales[layer],
                                la.windows[layer], la.softcaps[layer])
        return out


class CrossPagedAttention(PagedAttention):
    """The paged seam of an encoder-decoder's decoder (Whisper), with cross-attention:
    each row attends over its own sequence's encoder K/V (CrossKVPool: computed once, on
    the sequence's first step), unmasked and without writing; one core call a layer."""

    __slots__ = ("cross_plan", "pool")

    def __init__(self, plans: list, k_caches, v_caches, layers: LayerAttention,
                 pool: CrossKVPool, row_seq_ids: np.ndarray) -> None:
        super().__init__(plans, k_caches, v_caches, layers)
        self.pool = pool
        self.cross_plan = pool.plan(row_seq_ids.tolist())

    def cross_attn(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(q)
        llmcore.paged_attention(self.cross_plan, q, self.pool.k[layer], self.pool.v[layer],
                                out, self.layers.default_scale)
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
