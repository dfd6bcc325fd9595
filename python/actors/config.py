"""EngineConfig: every setting of the engine, in one place.

The engine (``actors.core.engine.LLMEngine``), the offline ``LLM`` and the server
(``server.config.ServerConfig.engine``) all hold this one object, so a setting and its
default are written once. The module imports nothing but the standard library: the
server's ``--help`` reads these defaults without loading torch or transformers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AdmissionWindow", "EngineConfig", "GiB"]

GiB = 1 << 30


# EngineConfig.quantization_activations -> the core's activation width (bits)
QUANT_ACTIVATION_BITS = {"int16": 16, "int8": 8}
# A profiling session's bounds (--profiler-config max_iterations, max_profile_bytes): it
# stops and writes its trace after this many engine steps, or once the process has grown by
# this many bytes while it records (actors.core.operator).
PROFILE_MAX_ITERATIONS = 1000
PROFILE_MAX_BYTES = 2 * 2**30


@dataclass(slots=True)
class EngineConfig:
    model: str | None = None  # None: the default SmolLM2-135M-Instruct GGUF
    dtype: str = "auto"  # auto | float32 | bfloat16
    # None (or "none") | "gguf" (vLLM's name): a GGUF model's Q8_0/Q4_0/Q4_1 matrices stay
    # quantized | "int8": any model's linear matrices quantized to Q8_0 blocks at load
    # (loader/int8.py) | "auto" (the server's default): "gguf" for a GGUF model whose
    # weights would be bf16, else None (loader.dtype.resolve_quantization)
    quantization: str | None = None
    # What quantized matrices (gguf, int8) meet: activations rounded per 32-block to "int16"
    # (the default: within ~2^-15 of each block's largest value) or "int8" (llama.cpp's q8)
    quantization_activations: str = "int16"  # a key of QUANT_ACTIVATION_BITS
    # Time the core's linear kernels against torch's on the model's shapes at load (about
    # 1.5 s) and route each (shape, M bucket) to the faster (actors.models.linear_routing)
    linear_routing: bool = True
    # A request's numbers do not depend on the batch it shares (the concurrency, chunked
    # prefill, prefix-cache hits): each row's linear kernels are chosen by its role, never
    # by the row count (actors.models.row_kernels), and nothing is routed by timing; the
    # core's attention gives a row the same bits in any call by itself.
    batch_invariant: bool = True
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    kv_cache_memory: int = 2 * GiB  # bytes for the KV cache of all layers
    kv_cache_dtype: str = "auto"  # auto (the model's dtype) | float32 | bfloat16
    enable_prefix_caching: bool = True
    # A model with sliding-window layers keeps their KV in groups of their own and frees the
    # blocks their windows have left while a sequence runs (actors.core.kv_groups); True
    # keeps every block of every layer, as for full attention (vLLM's flag of that name).
    disable_hybrid_kv_cache_manager: bool = False
    seed: int | None = None
    scheduling_policy: str = "fcfs"  # fcfs | priority
    generation_config: str = "auto"  # auto (the model's file) | vllm (none) | a directory
    max_logprobs: int = 20
    num_threads: int | None = None  # CPU threads for torch and the core; None: all
    # Grammar backend of structured outputs: auto (= guidance, llguidance) | guidance |
    # xgrammar; vLLM's --structured-outputs-config backend=...
    structured_outputs_backend: str = "auto"
    # Constrained choices take the tokens their grammar forces without a model step each
    # (exact: the masked sampler could draw nothing else); --structured-outputs-config
    # fast_forward=false turns it off.
    structured_fast_forward: bool = True
    # LoRA adapters (vLLM's --enable-lora, --max-loras, --max-lora-rank): slots kept for
    # that many adapters at once, each of rank up to max_lora_rank.
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AdmissionWindow:
    """How long an idle engine's first step may wait for the rest of a burst of requests
    (actors.runtime.burst; the server's --admission-window-ms and --admission-quiet-ms)."""

    cap_s: float = 0.050  # the most one wait lasts; 0: never wait
    quiet_s: float = 0.0015  # a burst has ended once no request arrived for this long

    def __post_init__(self) -> None:
        for name in ("cap_s", "quiet_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"admission window {name} must be >= 0, got {value!r}")

    @property
    def enabled(self) -> bool:
        return self.cap_s > 0
