"""Pooling of per-token hidden states into one vector per sequence (for embeddings).

Two forms over one set of rules:
- ``pool``: a flattened batch of whole sequences end to end (``seq_lens`` says where each
  one ends), for tests and offline use;
- ``PoolState``: one sequence fed chunk by chunk, as the engine computes a long prompt
  over several steps (a MEAN keeps a running sum, CLS the row at position 0, LAST the
  latest row), so no step holds more than its own rows.

``finish`` applies what follows the pooling: the first ``dimensions`` components
(Matryoshka), then L2 normalization, in float32, as vLLM's embedding pooler does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = ["PoolState", "finish", "pool"]

_MODES = ("last", "mean", "cls")


def finish(vec: torch.Tensor, dimensions: int | None = None,
           normalize: bool = False) -> torch.Tensor:
    """[..., H] -> [..., dimensions or H] float32, L2-normalized if asked."""
    out = vec.float()
    if dimensions is not None:
        out = out[..., :dimensions]
    return F.normalize(out, p=2, dim=-1) if normalize else out


class PoolState:
    """One sequence's pooling across the chunks of its prompt (in order)."""

    __slots__ = ("mode", "_acc", "_count")

    def __init__(self, mode: str) -> None:
        mode = mode.lower()
        if mode not in _MODES:
            raise ValueError(f"unknown pooling mode {mode!r} ({', '.join(_MODES)})")
        self.mode = mode
        self._acc: torch.Tensor | None = None
        self._count = 0

    def add(self, rows: torch.Tensor, start_pos: int) -> None:
        """rows [n, H]: the final hidden states of positions start_pos .. start_pos + n."""
        if self.mode == "mean":
            s = rows.float().sum(0)
            self._acc = s if self._acc is None else self._acc + s
            self._count += rows.shape[0]
        elif self.mode == "cls":
            if start_pos == 0:
                self._acc = rows[0].float().clone()
        else:
            self._acc = rows[-1].float().clone()

    def result(self) -> torch.Tensor:
        if self._acc is None:
            raise RuntimeError(f"{self.mode} pooling saw no rows (or, for cls, not row 0)")
        return self._acc / self._count if self.mode == "mean" else self._acc


def pool(
    hidden: torch.Tensor,
    seq_lens: Sequence[int],
    mode: str = "last",
    normalize: bool = False,
    dimensions: int | None = None,
) -> torch.Tensor:
    """hidden [T, H] with sum(seq_lens) == T -> [len(seq_lens), H] (float32)."""
    if sum(seq_lens) != hidden.shape[0] or any(n <= 0 for n in seq_lens):
        raise ValueError(f"seq_lens {list(seq_lens)} do not tile {hidden.shape[0]} rows")
    out = []
    for chunk in hidden.split(list(seq_lens)):
        st = PoolState(mode)
        st.add(chunk, 0)
        out.append(st.result())
    return finish(torch.stack(out), dimensions, normalize)
