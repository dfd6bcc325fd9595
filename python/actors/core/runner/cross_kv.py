"""CrossKVPool: an encoder-decoder's cross-attention K/V, one slot per live sequence.

Each Whisper window's decoder layers attend over the same encoder states at every step:
their K/V (per layer [heads, 1500, head_size]) is computed once, on the sequence's first
step, and read by every step after. Held as separate tensors and read by one SDPA call per
sequence and layer, a decode step spent most of its time there (8 windows of base: 50 ms a
layer on the development machine). Here every sequence owns a slot of fixed-size blocks in
one tensor per layer, laid out as the paged cache is ([blocks, heads, block_size,
head_size], in the KV cache's dtype), so a step's cross-attention is one core
``paged_attention`` call per layer over all rows (8.5 ms for the same 8 windows, float32;
bf16 halves the bytes read). It is not the decoder's paged cache: a slot is allocated whole
when the sequence arrives and never grows, and the scheduler's block accounting never sees
it.

Each row of a step is its own single-query "sequence" of the cross plan whose context is
the whole encoder output (position = length - 1, so the causal kernel masks nothing).
The pool starts small and doubles when every slot is taken (copying the live slots once);
it never shrinks by itself. ``reset`` (the operator's /reset_encoder_cache) hands an idle
pool's tensors back; live sequences keep their slots, so a reset under load frees nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import llmcore
import numpy as np
import torch

__all__ = ["CrossKVPool"]

INITIAL_SLOTS = 4


class CrossKVPool:
    def __init__(self, num_layers: int, num_heads: int, head_size: int, block_size: int,
                 dtype: torch.dtype) -> None:
        self.num_layers, self.num_heads, self.head_size = num_layers, num_heads, head_size
        self.block_size, self.dtype = block_size, dtype
        self.positions = 0  # encoder positions (1500), fixed by the first sequence
        self.blocks_per_slot = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self._free: list[int] = []
        self._slot: dict[int, int] = {}  # seq id -> slot

    def __len__(self) -> int:
        return len(self._slot)

    def add(self, seq_id: int, kv: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Stores one sequence's per-layer (k, v), each [heads, positions, head_size]."""
        positions = kv[0][0].shape[1]
        if not self.k:
            self.positions = positions
            self.blocks_per_slot = -(-positions // self.block_size)
            self._grow(INITIAL_SLOTS)
        elif positions != self.positions:
            raise ValueError(f"encoder output of {positions} positions; the pool holds "
                             f"{self.positions}")
        if not self._free:
            self._grow(2 * (len(self.k[0]) // self.blocks_per_slot))
        slot = self._free.pop()
        self._slot[seq_id] = slot
        bps, bs = self.blocks_per_slot, self.block_size
        rows = slice(slot * bps, (slot + 1) * bps)
        padded = torch.zeros((self.num_heads, bps * bs, self.head_size), dtype=self.dtype)
        for layer, (k, v) in enumerate(kv):
            for cache, x in ((self.k[layer], k), (self.v[layer], v)):
                padded[:, :positions] = x
                cache[rows] = padded.view(self.num_heads, bps, bs, self.head_size).transpose(0, 1)

    def reset(self) -> int:
        """Drops every tensor when no sequence holds a slot; returns the bytes dropped (0
        while any sequence is live: each still reads its own K/V)."""
        if self._slot or not self.k:
            return 0
        freed = sum(t.numel() * t.element_size() for t in (*self.k, *self.v))
        self.k, self.v, self._free = [], [], []
        self.positions = self.blocks_per_slot = 0
        return freed

    def release(self, seq_id: int) -> None:
        slot = self._slot.pop(seq_id, None)
        if slot is not None:
            self._free.append(slot)

    def plan(self, row_seq_ids: Sequence[int]) -> llmcore.AttentionPlan:
        """The cross-attention plan of a step whose rows belong to these sequences."""
        n, bps = len(row_seq_ids), self.blocks_per_slot
        slots = np.fromiter((self._slot[s] for s in row_seq_ids), np.int32, n)
        tables = (slots[:, None] * bps + np.arange(bps, dtype=np.int32)[None, :]).astype(np.int32)
        return llmcore.AttentionPlan(np.arange(n + 1, dtype=np.int32),
                                     np.full(n, self.positions, dtype=np.int32), tables,
                                     np.zeros(n, dtype=np.int64),
                                     num_blocks=len(self.k[0]))

    def _grow(self, slots: int) -> None:
        shape = (slots * self.blocks_per_slot, self.num_heads, self.block_size, self.head_size)
        old = len(self.k[0]) // self.blocks_per_slot if self.k else 0
        for caches in (self.k, self.v):
            for layer in range(self.num_layers):
                new = torch.empty(shape, dtype=self.dtype)
                if layer < len(caches):
                    new[: len(caches[layer])] = caches[layer]
                    caches[layer] = new
                else:
                    caches.append(new)
        self._free.extend(range(slots - 1, old - 1, -1))
