"""moe: the routed experts of a mixture-of-experts layer in one native call.

``moe_experts(x, topk_ids, topk_weights, experts, out=None)`` computes, for SiLU-gated
experts (Qwen3-MoE, Mixtral)::

    out[t] = sum_j topk_weights[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])),  e = topk_ids[t, j]

The router (softmax, top-k, the optional renormalisation of the top-k weights) stays with
the model: it passes the chosen ids and weights. ``experts`` is a ``PackedExperts``: E
``PackedWeight`` gate/up matrices ``[2I, H]`` (the gate rows, then the up rows) and E down
matrices ``[H, I]``, each float32, bfloat16 or a GGUF quantized format, built once at load
(``pack_experts`` packs stacked tensors). The core groups the routed rows by expert and runs
one multi-row product per used expert, so a decode step reads each used expert's weights
once; a token's result has the same bits whatever else is in the batch.

A repeated id within a row is allowed and contributes once per occurrence (real routers pick
distinct experts). Tensors are torch tensors or numpy arrays on the CPU (CUDA:
NotImplementedError); the ids are int32 or int64. The GIL is released while the kernel runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from llmcore import _C
from llmcore._C import PackedExperts, PackedWeight

__all__ = ["PackedExperts", "moe_experts", "pack_experts"]


def pack_experts(gate_up: Iterable[Any], down: Iterable[Any]) -> PackedExperts:
    """PackedExperts from float matrices: ``gate_up`` ``[E, 2I, H]`` (a stacked tensor or E
    matrices), ``down`` ``[E, H, I]``, float32 or bfloat16; each expert is copied once into
    the linear layout. Quantized experts: build the PackedWeight objects with
    ``PackedWeight.from_gguf`` and pass them to ``PackedExperts`` directly."""
    return PackedExperts([PackedWeight(w) for w in gate_up], [PackedWeight(w) for w in down])


def moe_experts(x: Any, topk_ids: Any, topk_weights: Any, experts: PackedExperts,
                out: Any = None) -> Any:
    """Returns the weighted sum of each token's routed experts, ``[T, H]`` float32.

    ``x`` ``[T, H]`` float32; ``topk_ids`` ``[T, k]`` int32/int64 in ``[0, E)``;
    ``topk_weights`` ``[T, k]`` float32. ``out`` (``[T, H]`` float32, may be ``x``) is
    allocated when not given (torch for torch inputs, numpy otherwise). Raises ValueError for
    inconsistent shapes, dtypes or ids out of range.
    """
    if out is None:
        shape = tuple(x.shape)  # [T, H] (anything else is refused by the core)
        if type(x).__module__.startswith("torch"):
            import torch

            out = torch.empty(shape, dtype=torch.float32, device=x.device)
        else:
            import numpy as np

            out = np.empty(shape, dtype=np.float32)
    return _C.moe_experts(x, topk_ids, topk_weights, experts, out)
