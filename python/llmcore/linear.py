"""linear: ``out = x @ weight.T (+ bias)`` with bf16 or fp32 weights, accumulated in fp32.

The point is bf16 *weights* with fp32 activations on CPUs without native bf16 arithmetic:
each bf16 weight is widened to fp32 in registers, so a memory-bound decode step reads half
the bytes of an fp32 model, while the activations (and the numerics) stay fp32. torch's own
bf16 matmul on such CPUs is an order of magnitude slower than fp32.

``weight`` is ``[N, K]`` (torch's ``nn.Linear`` layout), contiguous, or a ``PackedWeight``:
the same matrix copied once into the layout the kernels stream (panels of 16 output columns,
huge pages), which is what a model keeps, or ``PackedWeight.from_gguf(type, blocks, n, k)``:
a GGUF matrix of a type in ``GGUF_KEPT_TYPES`` (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
Q6_K) kept in its blocks (4.5-8.5 bits a weight), multiplied with x rounded per 32-block to
int16 (or int8) and exact integer block dots; ``x`` is ``[..., K]``
float32; ``bias`` is ``[N]`` or None. Tensors are torch tensors or numpy arrays, borrowed
through ``__dlpack__`` without a copy; the GIL is released while the kernel runs.
"""

from __future__ import annotations

from typing import Any

from llmcore import _C
from llmcore._C import PackedWeight, linear_isa

__all__ = ["GGUF_KEPT_TYPES", "PackedWeight", "linear", "linear_isa"]

# ggml type number -> name (``PackedWeight.dtype``) of the GGUF types the core keeps quantized;
# the loader keeps exactly these and dequantizes the others.
GGUF_KEPT_TYPES: dict[int, str] = dict(_C.gguf_kept_types())


def linear(x: Any, weight: Any, bias: Any = None, out: Any = None) -> Any:
    """Returns ``x @ weight.T (+ bias)`` as float32, written into ``out`` when given.

    ``out`` must then be ``[M, N]`` float32 or bfloat16 for a 2-D ``x``. Without ``out``,
    a float32 result of shape ``[*x.shape[:-1], N]`` is allocated (torch for torch inputs,
    numpy otherwise). Raises ValueError for inconsistent shapes or dtypes.
    """
    if out is not None:
        return _C.linear(x, weight, bias, out)
    packed = isinstance(weight, PackedWeight)
    if x.ndim < 1 or (not packed and weight.ndim != 2):
        raise ValueError(f"x must be [..., K] and weight [N, K], got x.ndim={x.ndim}, "
                         f"weight.ndim={weight.ndim}")
    lead = tuple(x.shape[:-1])
    x2 = x if x.ndim == 2 else x.reshape(-1, x.shape[-1])
    shape = (x2.shape[0], weight.shape[0])
    if type(x).__module__.startswith("torch"):
        import torch

        res = torch.empty(shape, dtype=torch.float32, device=x.device)
    else:
        import numpy as np

        res = np.empty(shape, dtype=np.float32)
    _C.linear(x2, weight, bias, res)
    return res if x.ndim == 2 else res.reshape(*lead, shape[1])
