"""Pooling of per-token hidden states into one vector per sequence (for embeddings).

The flattened batch carries sequences end to end; ``seq_lens`` says where each one ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F

PoolingMode = Literal["last", "mean"]


def pool(
    hidden: torch.Tensor,
    seq_lens: Sequence[int],
    mode: PoolingMode = "last",
    normalize: bool = False,
) -> torch.Tensor:
    """hidden [T, H] with sum(seq_lens) == T -> [len(seq_lens), H] (float32)."""
    if sum(seq_lens) != hidden.shape[0] or any(n <= 0 for n in seq_lens):
        raise ValueError(f"seq_lens {list(seq_lens)} do not tile {hidden.shape[0]} rows")
    h = hidden.float()
    if mode == "last":
        ends = torch.tensor(seq_lens, device=h.device).cumsum(0) - 1
        out = h.index_select(0, ends)
    elif mode == "mean":
        out = torch.stack([chunk.mean(0) for chunk in h.split(list(seq_lens))])
    else:
        raise ValueError(f"unknown pooling mode {mode!r} (last or mean)")
    return F.normalize(out, p=2, dim=-1) if normalize else out
