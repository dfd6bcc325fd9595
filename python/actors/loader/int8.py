"""int8 weights for any checkpoint (``--quantization int8``): the decoder's linear matrices
quantized at load into the core's Q8_0 blocks and multiplied by its Q8_0 kernels.

Q8_0 is GGUF's symmetric int8 with one fp16 scale per 32 weights of a row (8.5 bits a
weight): finer than one scale per output channel, so a row with a few large weights loses
little elsewhere, and the core already has exact-integer kernels for it (scalar, AVX2,
AVX512_VNNI) with activations rounded per 32-block to int8. A Hugging Face directory or a
GGUF model in float types (after its conversion) gets about half of bf16's bytes per token
without a new kernel. The blocks are gguf-py's ``quantize(..., Q8_0)`` (tests/test_int8.py),
so a matrix quantized here and one shipped as Q8_0 are the same.

What is quantized is chosen by measurement (tests/test_int8.py, docs/architecture.md):
every decoder layer's qkv, o, gate/up and down matrix, and the LM head or tied embedding
as well. A matrix whose K is not a multiple of 32 stays in the model's dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from actors.models.llama import LlamaForCausalLM

Q8_0 = 8  # ggml's type number for Q8_0 (llmcore.PackedWeight.from_gguf)
BLOCK = 32


def q8_0_blocks(weight: torch.Tensor) -> np.ndarray:
    """[N, K] float matrix -> its Q8_0 rows, [N, K / 32 * 34] uint8 (per block: the fp16
    scale d = max|w| / 127, then 32 int8 round(w / d)).

    gguf-py's formula, in four passes over the matrix (the model's 134M weights take a few
    seconds on two cores), except that an exact half rounds to even here, away from zero
    there: either is a correct rounding, and a tie needs w / d to land on k + 0.5 exactly."""
    import torch

    n, k = weight.shape
    if k % BLOCK:
        raise ValueError(f"Q8_0 needs K a multiple of {BLOCK}, got {k}")
    w = weight.detach().to(torch.float32).reshape(n, k // BLOCK, BLOCK)
    lo, hi = torch.aminmax(w, dim=-1, keepdim=True)
    d = torch.maximum(-lo, hi) / 127
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    out = torch.empty((n, k // BLOCK, 2 + BLOCK), dtype=torch.uint8)
    out[..., :2].view(torch.float16).copy_(d)
    out[..., 2:].view(torch.int8).copy_(torch.mul(w, inv).round_())
    return out.reshape(n, -1).numpy()


def int8_weights(model: LlamaForCausalLM, lm_head: bool = True) -> dict[str, Any]:
    """Module name -> llmcore.PackedWeight in Q8_0 for ``model.pack_weights``: every linear
    of the decoder layers, and with ``lm_head`` the LM head (or the tied embedding, which
    the model then looks up from the same blocks)."""
    import llmcore

    from actors.models.llama import Linear, LlamaForCausalLM

    if not isinstance(model, LlamaForCausalLM):
        raise ValueError(f"--quantization int8 serves the causal decoders, not "
                         f"{model.config.model_type}")
    out: dict[str, Any] = {}

    def put(name: str, weight: torch.Tensor) -> None:
        if weight.shape[1] % BLOCK == 0:
            n, k = weight.shape
            out[name] = llmcore.PackedWeight.from_gguf(Q8_0, q8_0_blocks(weight), n, k)

    for name, mod in model.named_modules():
        # a MoE router stays float: its top-k choice is where rounding would show
        if (isinstance(mod, Linear) and name.startswith("model.layers.")
                and not name.endswith(".mlp.gate")):
            put(name, mod.weight)
    if lm_head:
        if model.lm_head is not None:
            put("lm_head", model.lm_head.weight)
        else:
            put("model.embed_tokens", model.model.embed_tokens.weight)
    return out
