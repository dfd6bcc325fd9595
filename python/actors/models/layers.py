"""The building blocks every model class shares: parameters left for ``load_weights`` to
fill, the linear layer (torch, or the core's packed kernels once packed) and RMSNorm.

Two dtypes run through them: ``dtype`` is the dtype of the large matrices and
``compute_dtype`` that of the activations. They are equal except for bf16 weights on a CPU
without bf16 arithmetic: there the matrices stay bf16 (half the bytes per token) and every
product runs in fp32 through ``llmcore.linear``, which widens the weights in registers.
"""

from __future__ import annotations

import llmcore
import torch
import torch.nn.functional as F
from torch import nn


def _param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    # Uninitialised on purpose: every parameter is overwritten by load_weights, and a
    # random init of a large model would cost seconds.
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


def _widening(dtype: torch.dtype, compute_dtype: torch.dtype) -> bool:
    """True when bf16 matrices multiply fp32 activations (llmcore.linear's job)."""
    return dtype == torch.bfloat16 and compute_dtype == torch.float32


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           widen: bool) -> torch.Tensor:
    """x [T, K] @ weight [N, K]^T (+ bias); widen: bf16 weight, fp32 x (see module doc)."""
    if not widen:
        return F.linear(x, weight, bias)
    out = x.new_empty((x.shape[0], weight.shape[0]))
    return llmcore._C.linear(x, weight, bias, out)


class PackedParts:
    """A fused matrix (q/k/v, gate/up) whose parts are kept in different formats, as a GGUF
    file stores them (Gemma 3's q and k in Q5_0, v in Q8_0): one packed matrix per part,
    each product written into its own columns of the fused output (the core's linear takes
    an output with any row stride), so no part is widened to a common format."""

    def __init__(self, parts: list[llmcore.PackedWeight]) -> None:
        ks = {p.shape[1] for p in parts}
        if len(ks) != 1:
            raise ValueError(f"fused parts differ in K: {sorted(ks)}")
        self.parts = list(parts)
        self.bounds: list[tuple[int, int]] = []
        start = 0
        for p in parts:
            self.bounds.append((start, start + p.shape[0]))
            start += p.shape[0]
        self.shape = (start, ks.pop())
        self.dtype = "+".join(p.dtype for p in parts)


def linear_parts(x: torch.Tensor, w: PackedParts, bias: torch.Tensor | None,
                 out: torch.Tensor, kernel: str = "auto") -> torch.Tensor:
    """``out = x @ w^T (+ bias)``, one core product per part into its columns (``kernel``:
    llmcore._C.linear's family choice)."""
    for p, (a, b) in zip(w.parts, w.bounds):
        llmcore._C.linear(x, p, None if bias is None else bias[a:b], out[:, a:b], kernel=kernel)
    return out


def linear_packed(x: torch.Tensor, packed: llmcore.PackedWeight | PackedParts,
                  bias: torch.Tensor | None) -> torch.Tensor:
    """x [T, K] fp32 @ packed^T (+ bias) through the core."""
    out = x.new_empty((x.shape[0], packed.shape[0]))
    if isinstance(packed, PackedParts):
        return linear_parts(x, packed, bias, out)
    return llmcore._C.linear(x, packed, bias, out)


def _released(p: nn.Parameter) -> nn.Parameter:
    """An empty stand-in for a parameter whose data now lives packed in the core."""
    return nn.Parameter(torch.empty(0, dtype=p.dtype, device=p.device), requires_grad=False)


class Linear(nn.Module):
    """y = x W^T (+ b), with parameters left for load_weights to fill.

    After ``pack()`` the matrix lives in the core (``llmcore.PackedWeight``: the layout its
    kernels stream, in huge pages) and ``weight`` is an empty stand-in."""

    def __init__(
        self, in_size: int, out_size: int, bias: bool, dtype: torch.dtype,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        compute_dtype = compute_dtype or dtype
        self.widen = _widening(dtype, compute_dtype)
        self.weight = _param(out_size, in_size, dtype=dtype)
        self.bias = _param(out_size, dtype=dtype) if bias else None
        self.packed: llmcore.PackedWeight | PackedParts | None = None

    def pack(self, packed: llmcore.PackedWeight | PackedParts | None = None) -> None:
        """packed: the matrix already in the core (a quantized GGUF copy, same shape);
        default: a packed copy of ``weight``."""
        if packed is not None and tuple(packed.shape) != tuple(self.weight.shape):
            raise ValueError(f"packed weight {tuple(packed.shape)} does not match "
                             f"{tuple(self.weight.shape)}")
        self.packed = packed or llmcore.PackedWeight(self.weight.detach())
        self.weight = _released(self.weight)

    @property
    def matrix(self) -> torch.Tensor | llmcore.PackedWeight | PackedParts:
        """What the core's linear multiplies by: the packed matrix, else the tensor."""
        return self.packed if self.packed is not None else self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return linear_packed(x, self.packed, self.bias)
        return linear(x, self.weight, self.bias, self.widen)


class RMSNorm(nn.Module):
    """x / rms(x) * w, statistics in float32 whatever the activation dtype.

    ``offset``: Gemma's norms scale by (1 + w); the loader folds the 1 into the stored
    weight (``fold_offset``), so every norm here, and the core's rms_norm, multiplies by
    the stored weight alone. Such a weight is kept in float32, where 1 + w rounds as
    transformers rounds it (in float32, from the checkpoint's value)."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype, offset: float = 0.0) -> None:
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = _param(size, dtype=torch.float32 if offset else dtype)

    def fold_offset(self, checkpoint_weight: torch.Tensor) -> torch.Tensor:
        """The stored weight for a checkpoint's norm weight."""
        if not self.offset:
            return checkpoint_weight
        return checkpoint_weight.float() + self.offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A bf16 weight times fp32 activations (bf16 weights, fp32 compute) promotes to fp32.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (x32 * self.weight).to(x.dtype)
        return self.weight * x32.to(x.dtype)


def gelu_tanh_mul(gu: torch.Tensor, inter: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """gelu_tanh(gate) * up of gu = [gate | up] (Gemma's gated MLP)."""
    gate, up = gu.split(inter, dim=-1)
    return torch.mul(F.gelu(gate, approximate="tanh"), up, out=out)


def silu_mul(gu: torch.Tensor, inter: int, out: torch.Tensor | None = None) -> torch.Tensor:
    gate, up = gu.split(inter, dim=-1)
    return torch.mul(F.silu(gate), up, out=out)


ACTIVATIONS = {"silu": silu_mul, "gelu_tanh": gelu_tanh_mul}
