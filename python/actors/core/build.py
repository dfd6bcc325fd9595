"""Assembles an engine's parts, in the order each needs the one before:

    load (or reuse) the model -> linear routing -> the family's hook and the context
    -> tokenizer, EOS, generation defaults -> KV sizing (groups, blocks) -> KV manager
    and its events -> scheduler -> runner -> held structured requests -> LoRA

``build_parts`` returns them as ``EngineParts``; ``LLMEngine`` (core/engine.py) is the
façade that steps them. Nothing here runs a request; everything a part needs from the
model family comes through its hook (models/hooks.py), so no family is named here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import llmcore
from actors.config import QUANT_ACTIVATION_BITS, EngineConfig, GiB
from actors.core.kv_events import KVEventLog, ZmqEventPublisher
from actors.core.kv_groups import KVGroups
from actors.core.kv_manager import KVManager
from actors.core.lora_adapters import LoraAdapters
from actors.core.runner.attention_seams import LayerAttention
from actors.core.runner.model_runner import ModelRunner, kv_bytes_per_block
from actors.core.runner.sampler import SamplingHooks
from actors.core.scheduler.config import SchedulerConfig
from actors.core.scheduler.policy import Scheduler
from actors.core.structured.held import HeldRequests
from actors.messages import EngineInfo
from actors.models.config import ModelConfig, UnsupportedModelError
from actors.models.hooks import ModelHook, PromptRules, hook_for
from actors.params.defaults import GenerationDefaults, load_generation_defaults

if TYPE_CHECKING:
    import torch

    from actors.loader import LoadedModel
    from actors.models.linear_routing import RoutingTable

__all__ = ["EngineParts", "build_parts"]

log = logging.getLogger("actors.core.engine")


@dataclass(slots=True)
class EngineParts:
    config: EngineConfig
    loaded: LoadedModel
    linear_routing: RoutingTable | None
    hook: ModelHook
    model_config: ModelConfig
    model_dir: Path
    dtype: torch.dtype
    kv_cache_dtype: torch.dtype
    max_model_len: int
    tokenizer: Any  # a transformers tokenizer
    eos_token_ids: tuple[int, ...]
    generation_defaults: GenerationDefaults
    kv_groups: KVGroups
    num_blocks: int
    kv: KVManager
    kv_events: ZmqEventPublisher | None
    scheduler: Scheduler
    runner: ModelRunner
    held: HeldRequests
    lora: LoraAdapters | None
    info: EngineInfo  # what the front end knows of the loaded core


def build_parts(config: EngineConfig, loaded: LoadedModel | None,
                grammar_cache: Callable[..., Any],
                lora_ids_in_use: Callable[[], set[int]]) -> EngineParts:
    """Loads config.model (or takes ``loaded``) and builds every part around it.
    ``grammar_cache`` and ``lora_ids_in_use`` are the engine's (the held requests' grammar
    source; the adapters a running sequence still uses, which unload waits for)."""
    import torch

    _set_threads(config)
    if loaded is None:
        from actors.loader import load_model
        from actors.loader.dtype import resolve_quantization

        # "auto" -> what it means for this model and CPU; the config then says it
        config.quantization = resolve_quantization(config.quantization, config.model,
                                                   config.dtype)
        loaded = load_model(config.model, config.dtype, quantization=config.quantization,
                            hf_overrides=config.hf_overrides)
    routing = _route_linears(config, loaded)
    mc = loaded.config
    hook = hook_for(loaded.model, mc)
    embeds_width = _prompt_embeds_width(config, loaded.model, mc.hidden_size)
    kv_dtype = _kv_cache_dtype(config.kv_cache_dtype, loaded.dtype)
    max_model_len = hook.context_length(config.max_model_len or mc.max_position_embeddings)
    if max_model_len > mc.max_position_embeddings:
        raise ValueError(f"max_model_len={max_model_len} exceeds the model's "
                         f"max_position_embeddings={mc.max_position_embeddings}")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(loaded.model_dir))
    eos = tuple(mc.eos_token_ids) or (
        (tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ())
    defaults = load_generation_defaults(loaded.model_dir, config.generation_config)

    # An encoder (BERT: pooling only) keeps no KV, so it has nothing to share; nor does an
    # encoder-decoder (Whisper), whose decoder prompt is the same few tokens for every
    # audio window: their KV depends on the audio, which no block hash sees.
    causal = bool(getattr(loaded.model, "is_causal", True))
    enc_dec = bool(getattr(loaded.model, "is_encoder_decoder", False))
    if causal and not llmcore._C.attention_head_size_supported(mc.head_dim):
        # refused at load (exit 2, one line), not at the first request's attention call
        raise UnsupportedModelError(f"head size {mc.head_dim} is not supported by the paged "
                                    f"attention (32, 64, 80, 96, 128 or 256)")
    # Sliding-window layers get KV cache groups of their own whose out-of-window blocks
    # are freed (kv_groups.py); a block is then one page of kv_groups.num_slots layers.
    windows = LayerAttention.of(loaded.model, mc.num_layers, mc.head_dim,
                                mc.sliding_windows).windows
    groups = KVGroups.from_windows(
        windows, hybrid=causal and not config.disable_hybrid_kv_cache_manager)
    per_block = kv_bytes_per_block(groups.num_slots, mc.num_kv_heads, mc.head_dim,
                                   config.block_size, kv_dtype)
    num_blocks = groups.num_blocks(config.kv_cache_memory, per_block, max_model_len,
                                   config.max_num_batched_tokens, config.block_size)
    log.info("KV cache: %d blocks x %d tokens (%.2f GiB, %s), %s", num_blocks,
             config.block_size, num_blocks * per_block / GiB,
             str(kv_dtype).removeprefix("torch."), groups.describe())

    # Its chains are keyed by a secret of this engine (extra_key=None: os.urandom), so no
    # one outside the process can compute a block hash or search for a colliding prefix.
    kv = KVManager(llmcore.BlockPool(num_blocks, config.block_size),
                   enable_prefix_caching=config.enable_prefix_caching and causal and not enc_dec,
                   extra_key=None, group_windows=groups.windows)
    kv_events = None  # --kv-events-config: the prefix cache's events, after each step
    events_cfg = config.extra.get("kv_events_config")
    if events_cfg is not None and kv.enable_prefix_caching:
        kv.events = KVEventLog(config.block_size, groups.windows[0])
        kv_events = ZmqEventPublisher(events_cfg, int(config.extra.get("data_parallel_rank", 0)))
    scheduler = Scheduler(SchedulerConfig(
        max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=max_model_len, policy=config.scheduling_policy,
        enable_prefix_caching=config.enable_prefix_caching, eos_token_ids=eos,
        seed=config.seed, causal=causal, encoder_decoder=enc_dec,
        suppress_tokens=hook.suppress_tokens(tokenizer),
        begin_suppress_tokens=hook.begin_suppress_tokens()), kv)
    runner = ModelRunner(
        loaded.model, num_layers=mc.num_layers, num_kv_heads=mc.num_kv_heads,
        head_size=mc.head_dim, vocab_size=mc.vocab_size, num_blocks=num_blocks,
        block_size=config.block_size, dtype=kv_dtype, sliding_windows=mc.sliding_windows,
        fast_forward=config.structured_fast_forward, kv_groups=groups,
        batch_invariant=config.batch_invariant)
    # structured outputs: requests held until their grammar compiles, and the grammars the
    # runner builds each choice's matcher from (never from the cache)
    held = HeldRequests(scheduler, config.structured_outputs_backend, grammar_cache,
                        str(loaded.model_dir), mc.vocab_size, eos)
    runner.structured_masks = held.mask
    rules = hook.prompt_rules(tokenizer, eos)
    if rules is not None:
        runner.family_rules = _as_sampling_hooks(rules)
    lora = None
    if config.enable_lora:
        model = loaded.model
        lora = LoraAdapters(mc, config.max_loras, config.max_lora_rank, lora_ids_in_use,
                            dtype=getattr(model, "compute_dtype", torch.float32),
                            device=next(model.parameters()).device)
        runner.lora, runner.lora_slots = lora.stacks, lora.slots
    return EngineParts(
        config=config, loaded=loaded, linear_routing=routing, hook=hook, model_config=mc,
        model_dir=loaded.model_dir, dtype=loaded.dtype, kv_cache_dtype=kv_dtype,
        max_model_len=max_model_len, tokenizer=tokenizer, eos_token_ids=eos,
        generation_defaults=defaults,
        kv_groups=groups, num_blocks=num_blocks, kv=kv, kv_events=kv_events,
        scheduler=scheduler, runner=runner, held=held, lora=lora,
        info=EngineInfo(
            model_dir=str(loaded.model_dir), vocab_size=mc.vocab_size,
            max_model_len=max_model_len, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            block_size=config.block_size, num_blocks=num_blocks,
            kv_cache_dtype=config.kv_cache_dtype,
            enable_prefix_caching=config.enable_prefix_caching,
            scheduling_policy=config.scheduling_policy, max_logprobs=config.max_logprobs,
            eos_token_ids=eos, generation_defaults=tuple(defaults.items()),
            kv_event_source=() if kv_events is None else tuple(kv_events.source().items()),
            prompt_embeds_width=embeds_width))



def _prompt_embeds_width(config: EngineConfig, model: Any, hidden_size: int) -> int:
    """The width of the prompt embeddings the engine takes (0: --enable-prompt-embeds is
    off); refuses the flag on a model whose first layer cannot take rows (vLLM's text for
    an encoder-decoder)."""
    if not config.enable_prompt_embeds:
        return 0
    if getattr(model, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            "--enable-prompt-embeds is not supported with encoder-decoder models.")
    if not getattr(model, "is_causal", True) or not hasattr(model, "embed"):
        raise UnsupportedModelError("--enable-prompt-embeds needs a generative decoder model")
    return hidden_size


def _set_threads(config: EngineConfig) -> None:
    """The process's torch and core thread counts, and the quantized activations' bits."""
    import torch

    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    llmcore.set_num_threads(torch.get_num_threads())
    bits = QUANT_ACTIVATION_BITS.get(config.quantization_activations)
    if bits is None:
        raise ValueError(f"quantization_activations must be one of "
                         f"{', '.join(QUANT_ACTIVATION_BITS)}, got "
                         f"{config.quantization_activations!r}")
    llmcore._C.set_quant_activation_bits(bits)


def _route_linears(config: EngineConfig, loaded: LoadedModel) -> RoutingTable | None:
    """The linear products' kernel table by row count, when the engine may route.

    Routing by row count makes a row's result depend on its batch (each alternative rounds
    differently), so it runs only without batch invariance and never for float32 weights;
    the invariant mode picks kernels by row role (row_kernels) instead."""
    import torch

    model = loaded.model
    route = getattr(model, "route_linears", None)
    if config.batch_invariant and getattr(model, "routing", None) is not None:
        raise ValueError("this model's linear products are routed (an engine without "
                         "batch invariance shares its weights): a batch-invariant engine "
                         "needs a model of its own")
    if config.linear_routing and not config.batch_invariant and route is not None and (
            loaded.dtype != torch.float32 or config.quantization is not None):
        table = route()
        if table is not None:
            log.info("%s", table.summary())
        return table
    if config.batch_invariant and hasattr(model, "use_row_kernels"):
        copies = model.use_row_kernels()  # kernels by row role (row_kernels)
        log.info("batch-invariant: kernels by row role; prompt rows' bf16 copies: %d MiB",
                 copies >> 20)
    return None


def _as_sampling_hooks(rules: PromptRules) -> Callable[[tuple[int, ...]],
                                                      SamplingHooks | None]:
    """A model hook's per-prompt processors as the runner's sampling hooks."""
    def hooks(prompt: tuple[int, ...]) -> SamplingHooks | None:
        processors = rules(prompt)
        return None if processors is None else SamplingHooks(logits_processors=processors)

    return hooks


def _kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The KV cache's element type, as vLLM's --kv-cache-dtype: 'auto' is the model's dtype
    (its weights': bf16 under --dtype auto on AVX2 CPUs, fp32 for a float32 model, which
    is then exact); bfloat16 under a float32 model halves the cache (twice the tokens in
    the same memory) and the bytes a decode step reads, at the cost of rounding K/V to 8
    mantissa bits."""
    from actors.loader.dtype import DTYPE_CHOICES, resolve_dtype

    if name not in DTYPE_CHOICES:
        raise ValueError(f"kv_cache_dtype={name!r} is not supported; choose one of "
                         f"{', '.join(DTYPE_CHOICES)}")
    return model_dtype if name == "auto" else resolve_dtype(name)
