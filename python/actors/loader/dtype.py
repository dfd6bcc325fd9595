"""resolve_dtype: the --dtype policy (auto | float32 | bfloat16).

"auto" picks bfloat16 weights on CPUs with native bf16 matmul (AVX512_BF16 or AMX) and on
CPUs with AVX2 + FMA, else float32. On CUDA devices "auto" means bfloat16.

Why AVX2 CPUs get bf16 weights: the model then keeps its activations in fp32 and runs every
projection through llmcore.linear, which widens bf16 weights to fp32 in registers, so a
memory-bound decode step reads half the weight bytes. torch's own bf16 matmul is no option
on such CPUs (oneDNN falls back to a conversion path; [64,576] x [576,1536] took 119 ms in
bf16 vs 1.46 ms in fp32). Measured on the development machine (AMD EPYC, AVX2 only, no
AVX-512, torch 2.13 CPU, shared with other work), SmolLM2-135M decode through the engine
(scripts/bench_linear.py --engine), ms per step:
    1 thread:  batch 1  float32 54.2  bfloat16 49.3;  batch 64  float32 376  bfloat16 293
    2 threads: batch 1  float32 63.9  bfloat16 52.8;  batch 64  float32 3347 bfloat16 1778
    (the 2-thread numbers are distorted by contention, but bf16 weights won every run)
Kernel level (1 thread): bf16-weight linear is 1.25-1.7x torch fp32 at M=1..8, on par to
1.6x faster at M=64..256; at M=2048 (prefill) 0.8-1.2x. Without AVX2 the portable kernel
is far slower than torch fp32, so such CPUs stay on float32.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPE_CHOICES = ("auto", "float32", "bfloat16")
# --quantization: "auto" (the server's default, resolve_quantization), "none" (= None), or
# a storage format for the linear matrices.
QUANTIZATION_CHOICES = ("auto", "none", "gguf", "int8")
_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
_WIDENING_FLAGS = frozenset({"avx2", "fma"})  # llmcore.linear's bf16-weight kernel


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_has_fast_bf16(flags: frozenset[str] | None = None) -> bool:
    return bool(_BF16_FLAGS & (cpu_flags() if flags is None else flags))


def resolve_dtype(name: str, device: str = "cpu") -> torch.dtype:
    import torch

    if name not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}, got {name!r}")
    if name == "float32":
        return torch.float32
    if name == "bfloat16":
        return torch.bfloat16
    if device.startswith("cuda"):
        return torch.bfloat16
    flags = cpu_flags()
    if cpu_has_fast_bf16(flags) or _WIDENING_FLAGS <= flags:
        return torch.bfloat16
    return torch.float32


def resolve_quantization(quantization: str | None, model: str | None, dtype: str,
                         flags: frozenset[str] | None = None) -> str | None:
    """The storage of the linear matrices: None (in the model's dtype), "gguf" or "int8".

    "auto" keeps a GGUF model's matrices in its own blocks (as vLLM does for a .gguf file;
    model None is the default model, a GGUF; a named GGUF counts) whenever the weights
    would be bf16 anyway:
    the blocks are the shipped weights (the bf16 copy rounds them), a decode step reads a
    quarter of the bytes, and the load-time routing gives large batches the bf16 kernel on
    a copy, so the result is at least as accurate and at least as fast. float32 (explicit,
    or "auto" on a CPU without AVX2 + FMA) stays the exact, unquantized mode.
    """
    if quantization in (None, "none"):
        return None
    if quantization != "auto":
        return quantization
    from actors.loader.default_model import is_gguf_model

    if not is_gguf_model(model) or dtype == "float32":
        return None
    if dtype == "bfloat16":
        return "gguf"
    have = cpu_flags() if flags is None else flags
    return "gguf" if cpu_has_fast_bf16(have) or _WIDENING_FLAGS <= have else None
