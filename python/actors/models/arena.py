"""Weights in one huge-page-backed arena.

A decode step streams every weight matrix once, so its speed is the memory bandwidth the
kernels get. With 4 KiB pages the hardware prefetchers stop at every page boundary and
each page costs a TLB miss; with 2 MiB transparent huge pages the same kernels read about
a third faster (measured on the default model's shapes, scripts/bench_linear.py). Linux
hands out huge pages only where asked (``transparent_hugepage=madvise`` is the usual
setting), so the model's parameters are moved, before any weight is loaded, into one
anonymous mapping marked ``MADV_HUGEPAGE``. Elsewhere (no madvise, another OS) the arena
is an ordinary mapping and nothing else changes.

Moving happens before ``load_weights``: the parameters are still untouched ``torch.empty``
memory then, so the move costs no copy and no extra resident memory.
"""

from __future__ import annotations

import mmap

import torch
from torch import nn

_ALIGN = 64  # bytes: a cache line, and what the vector kernels like
_MIN_BYTES = 1 << 16  # small parameters (norm weights, biases) stay where they are


def place_parameters_in_arena(model: nn.Module) -> int:
    """Rehomes every large parameter of ``model`` into one huge-page arena; returns the
    arena's size in bytes (0 when nothing was large enough)."""
    params = [p for p in model.parameters() if p.numel() * p.element_size() >= _MIN_BYTES]
    if not params:
        return 0
    offsets, total = [], 0
    for p in params:
        offsets.append(total)
        total += -(-p.numel() * p.element_size() // _ALIGN) * _ALIGN
    # Private: a shared anonymous mapping is shmem, whose huge pages follow another switch.
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    buf = mmap.mmap(-1, total, flags=flags) if flags else mmap.mmap(-1, total)
    if hasattr(buf, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass  # THP disabled: ordinary pages
    arena = torch.frombuffer(buf, dtype=torch.uint8)
    for p, off in zip(params, offsets):
        nbytes = p.numel() * p.element_size()
        view = arena[off: off + nbytes].view(p.dtype).view(p.shape)
        p.data = view
    return total
