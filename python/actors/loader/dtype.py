"""resolve_dtype: the --dtype policy (auto | float32 | bfloat16).

"auto" picks bfloat16 only when the CPU has native bf16 matmul support (AVX512_BF16 or
AMX), else float32. Without those instructions oneDNN falls back to a conversion path
that is far slower than fp32. Measured on the development machine (AMD EPYC, AVX2 only,
torch 2.13 CPU, 2 threads), [M,576] x [576,1536] (SmolLM2-135M's MLP shape):
    M=64: float32 1.46 ms (77 GFLOP/s)   bfloat16 119 ms (0.9 GFLOP/s)  -> fp32 ~80x faster
    M=1:  float32 0.32 ms (5.5 GFLOP/s)  bfloat16 3.6 ms (0.5 GFLOP/s)  -> fp32 ~11x faster
so on such CPUs bf16 is not a speed option at all, only a memory one (ask for it explicitly).
On CUDA devices "auto" means bfloat16.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPE_CHOICES = ("auto", "float32", "bfloat16")
_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


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
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
