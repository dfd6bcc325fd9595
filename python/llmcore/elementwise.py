"""The per-token operations between a decoder layer's matmuls, one native call each.

``rms_norm(x, weight, eps, out, residual=None)``: RMS norm row by row; with ``residual``,
the residual stream is updated in place (``residual += x``) and normalised, the "add, then
norm" of a pre-norm layer. ``silu_mul(x, out)``: the gated MLP activation
``silu(gate) * up`` of ``x = [gate | up]``. ``rope(q, k, cos, sin)``: rotary embedding in
place, rotate-half layout, with one row of angles per token.

float32 CPU tensors (torch or numpy), borrowed through DLPack; the GIL is released while
the kernels run.
"""

from __future__ import annotations

from llmcore._C import rms_norm, rope, set_elementwise_isa, silu_mul

__all__ = ["rms_norm", "rope", "set_elementwise_isa", "silu_mul"]
