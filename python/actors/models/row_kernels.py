"""Which kernel family multiplies each row of a step, chosen by what the row is, not by
how many rows share the step (batch-invariant serving with fast prefill).

The core's linear kernels each give a row the same bits at every row count M, but one
matrix can have two families whose roundings differ: a quantized matrix's integer kernels
(VNNI, and the AMX-INT8 tiles, which give the VNNI bits) and the AMX bf16 tiles on a bf16
copy of it; a bf16 matrix's ``vdpbf16ps`` dots and its AMX tiles. Picking the family by the
call's M (what linear routing does) makes a row's result depend on its batch. Picking it by
the row's role does not:

- rows of generated tokens (decode: one row per sequence, products bound by the weight's
  bytes) take the dot family on the matrix as stored: the quantized kernel reading 4.5-8.5
  bits a weight, or ``vdpbf16ps`` on a bf16 matrix (the tiles stream a bf16 matrix at
  ~0.6x its speed at M = 1-2);
- prompt rows (prefill: compute-bound) take the tiles, on a bf16 copy of a quantized matrix
  (``prompt_copies``): the AMX bf16 tiles run a prompt at several times the integer
  kernels' speed.

So a token's row runs the same kernel whether its sequence is alone or among 31 others,
whatever the chunking and the prefix-cache hits (a cached prompt's K/V came from prompt
rows too); a preempted sequence recomputing its generated tokens sends them through the
dot family again, as they first ran. The LM head and the prompt-logprob rows take the dot
family on the stored matrix whatever the row (a few rows per step).

The runner sets the step's split (``active``) around the forward pass; a kernel called
outside one (a test calling the model directly) runs every row as a prompt row.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import llmcore
import numpy as np
import torch

_local = threading.local()

RowFn = Callable[[torch.Tensor, Any, torch.Tensor | None, torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class RowSplit:
    """A step's rows by role: ``generated``/``prompt`` index tensors (int64), either None
    when the step has no row of that role."""

    generated: torch.Tensor | None
    prompt: torch.Tensor | None

    @staticmethod
    def of(generated: np.ndarray) -> RowSplit:
        """From a bool mask over the step's rows (True: a generated token's row)."""
        g = np.flatnonzero(generated)
        if len(g) == len(generated):
            return RowSplit(torch.from_numpy(g), None)
        if len(g) == 0:
            return RowSplit(None, torch.arange(len(generated)))
        return RowSplit(torch.from_numpy(g), torch.from_numpy(np.flatnonzero(~generated)))


@contextmanager
def active(split: RowSplit | None) -> Iterator[None]:
    """Makes ``split`` the rows' roles of the forward pass run inside (this thread)."""
    prev = getattr(_local, "split", None)
    _local.split = split
    try:
        yield
    finally:
        _local.split = prev


def current() -> RowSplit | None:
    return getattr(_local, "split", None)


def dot(x: torch.Tensor, w: Any, bias: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    return llmcore._C.linear(x, w, bias, out, kernel="dot")


def tiles(x: torch.Tensor, w: Any, bias: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    return llmcore._C.linear(x, w, bias, out, kernel="tiles")


def split_kernel(stored: Any, prompt_matrix: Any, dot_fn: RowFn = dot,
                 tiles_fn: RowFn = tiles) -> Callable[..., torch.Tensor]:
    """A plan kernel ``(x, _w, bias, out)``: the step's generated rows through ``dot_fn``
    on ``stored``, its prompt rows through ``tiles_fn`` on ``prompt_matrix`` (``stored``
    itself, or its bf16 copy)."""

    def run(x: torch.Tensor, _w: Any, bias: torch.Tensor | None,
            out: torch.Tensor) -> torch.Tensor:
        s = current()
        if s is None or s.generated is None:
            return tiles_fn(x, prompt_matrix, bias, out)
        if s.prompt is None:
            return dot_fn(x, stored, bias, out)
        for rows, fn, w in ((s.generated, dot_fn, stored), (s.prompt, tiles_fn, prompt_matrix)):
            part = fn(x.index_select(0, rows), w, bias,
                      out.new_empty((len(rows), out.shape[1])))
            out.index_copy_(0, rows, part)
        return out

    return run


def prompt_copy_wanted(total_copy_bytes: int) -> bool:
    """Whether quantized matrices get a bf16 copy for prompt rows: where the CPU runs the
    AMX bf16 tiles (elsewhere the integer kernels are the faster prefill on the stored
    blocks, or near it) and the copies take at most a quarter of the machine's memory."""
    if llmcore.isa.current()["linear"] != "amx":
        return False
    try:
        import os

        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return False
    return total_copy_bytes <= total // 4
