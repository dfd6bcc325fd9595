"""LLMEngine: the model, the scheduler and the KV manager, stepped synchronously.

The HTTP server drives the same pieces from separate Trio actors (the scheduler in
one, ``runner.execute`` in a worker thread of another); the offline ``LLM`` API and the
benchmarks call ``step()`` in a loop.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import llmcore
from actors.config import QUANT_ACTIVATION_BITS, EngineConfig, GiB  # EngineConfig re-exported
from actors.core.kv_events import KVEventLog, ZmqEventPublisher
from actors.core.kv_groups import KVGroups
from actors.core.kv_manager import KVManager
from actors.core.lora_adapters import LoraAdapters
from actors.core.operator import Operator
from actors.errors import RequestRefused
from actors.messages import Abort, Admit, Control, ControlResult, EngineInfo, EngineStats
from actors.messages import RequestOutput, TokenBatch
from actors.core.runner.attention_seams import LayerAttention
from actors.core.runner.model_runner import ModelRunner, kv_bytes_per_block
from actors.params.defaults import load_generation_defaults
from actors.params.sampling import SamplingParams
from actors.core.scheduler.config import SchedulerConfig
from actors.core.scheduler.policy import Scheduler
from actors.core.structured.held import HeldRequests
from actors.models.config import UnsupportedModelError
from actors.models.hooks import hook_for

__all__ = ["EngineConfig", "LLMEngine"]

log = logging.getLogger("actors.core.engine")


class LLMEngine:
    def __init__(self, config: EngineConfig, loaded: Any = None) -> None:
        """Loads config.model, or reuses ``loaded`` (a LoadedModel) when given: several
        engines may share one set of weights (tests, benchmarks)."""
        import torch

        from actors.loader import load_model
        from actors.loader.dtype import resolve_quantization

        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        llmcore.set_num_threads(torch.get_num_threads())
        bits = QUANT_ACTIVATION_BITS.get(config.quantization_activations)
        if bits is None:
            raise ValueError(f"quantization_activations must be one of "
                             f"{', '.join(QUANT_ACTIVATION_BITS)}, got "
                             f"{config.quantization_activations!r}")
        llmcore._C.set_quant_activation_bits(bits)

        t0 = time.perf_counter()
        if loaded is None:
            # "auto" -> what it means for this model and CPU; the config then says it
            config.quantization = resolve_quantization(config.quantization, config.model,
                                                       config.dtype)
            loaded = load_model(config.model, config.dtype,
                                quantization=config.quantization)
        self.loaded = loaded
        self.linear_routing = None  # actors.models.linear_routing.RoutingTable, once timed
        route = getattr(loaded.model, "route_linears", None)
        # Routing by row count makes a row's result depend on its batch (each alternative
        # rounds differently), so it runs only without batch invariance and never for
        # float32 weights; the invariant mode picks kernels by row role (row_kernels).
        if config.batch_invariant and getattr(loaded.model, "routing", None) is not None:
            raise ValueError("this model's linear products are routed (an engine without "
                             "batch invariance shares its weights): a batch-invariant engine "
                             "needs a model of its own")
        if config.linear_routing and not config.batch_invariant and route is not None and (
                loaded.dtype != torch.float32 or config.quantization is not None):
            self.linear_routing = route()
            if self.linear_routing is not None:
                log.info("%s", self.linear_routing.summary())
        elif config.batch_invariant and hasattr(loaded.model, "use_row_kernels"):
            copies = loaded.model.use_row_kernels()  # kernels by row role (row_kernels)
            log.info("batch-invariant: kernels by row role; prompt rows' bf16 copies: %d MiB",
                     copies >> 20)
        mc = loaded.config
        self.model_config = mc
        self.model_dir: Path = loaded.model_dir
        self.dtype = loaded.dtype
        self.kv_cache_dtype = _kv_cache_dtype(config.kv_cache_dtype, self.dtype)
        max_model_len = config.max_model_len or mc.max_position_embeddings
        if mc.model_type == "whisper" and max_model_len > mc.max_position_embeddings:
            # The decoder's learned position table (448) is Whisper's whole context; a
            # server-wide --max-model-len above it means "as long as the model allows".
            log.info("max_model_len %d capped at Whisper's decoder length %d", max_model_len,
                     mc.max_position_embeddings)
            max_model_len = mc.max_position_embeddings
        if max_model_len > mc.max_position_embeddings:
            raise ValueError(
                f"max_model_len={max_model_len} exceeds the model's "
                f"max_position_embeddings={mc.max_position_embeddings}"
            )
        self.max_model_len = max_model_len
        self.tokenizer = _load_tokenizer(self.model_dir)
        self.eos_token_ids = tuple(mc.eos_token_ids) or (
            (self.tokenizer.eos_token_id,) if self.tokenizer.eos_token_id is not None else ()
        )
        self.vocab_size = mc.vocab_size
        self.generation_defaults = load_generation_defaults(self.model_dir,
                                                            config.generation_config)

        # An encoder (BERT: pooling only) keeps no KV, so it has nothing to share; nor
        # does an encoder-decoder (Whisper), whose decoder prompt is the same few tokens
        # for every audio window: their KV depends on the audio, which no block hash sees.
        causal = bool(getattr(loaded.model, "is_causal", True))
        enc_dec = bool(getattr(loaded.model, "is_encoder_decoder", False))
        if causal and not llmcore._C.attention_head_size_supported(mc.head_dim):
            # refused at load (exit 2, one line), not at the first request's attention call
            raise UnsupportedModelError(
                f"head size {mc.head_dim} is not supported by the paged attention "
                f"(32, 64, 80, 96, 128 or 256)")
        # Sliding-window layers get KV cache groups of their own whose out-of-window blocks
        # are freed (kv_groups.py); a block is then one page of kv_groups.num_slots layers.
        windows = LayerAttention.of(loaded.model, mc.num_layers, mc.head_dim,
                                    mc.sliding_windows).windows
        self.kv_groups = KVGroups.from_windows(
            windows, hybrid=causal and not config.disable_hybrid_kv_cache_manager)
        groups = self.kv_groups
        per_block = kv_bytes_per_block(groups.num_slots, mc.num_kv_heads, mc.head_dim,
                                       config.block_size, self.kv_cache_dtype)
        self.num_blocks = num_blocks = groups.num_blocks(
            config.kv_cache_memory, per_block, max_model_len, config.max_num_batched_tokens,
            config.block_size)
        log.info("KV cache: %d blocks x %d tokens (%.2f GiB, %s), %s", num_blocks,
                 config.block_size, num_blocks * per_block / GiB,
                 str(self.kv_cache_dtype).removeprefix("torch."), groups.describe())

        pool = llmcore.BlockPool(num_blocks, config.block_size)
        # Its chains are keyed by a secret of this engine (extra_key=None: os.urandom), so no
        # one outside the process can compute a block hash or search for a colliding prefix.
        self.kv = KVManager(pool, enable_prefix_caching=(config.enable_prefix_caching and causal
                                                         and not enc_dec), extra_key=None,
                            group_windows=groups.windows)
        # --kv-events-config: the prefix cache's events, published after each step
        self.kv_events: ZmqEventPublisher | None = None
        events_cfg = config.extra.get("kv_events_config")
        if events_cfg is not None and self.kv.enable_prefix_caching:
            self.kv.events = KVEventLog(config.block_size)
            self.kv_events = ZmqEventPublisher(
                events_cfg, int(config.extra.get("data_parallel_rank", 0)))
        # the family's decoding rules (models/hooks.py: Whisper's banned tokens, timestamps)
        hook = hook_for(loaded.model, mc)
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                max_model_len=max_model_len,
                policy=config.scheduling_policy,
                enable_prefix_caching=config.enable_prefix_caching,
                eos_token_ids=self.eos_token_ids,
                seed=config.seed,
                causal=causal,
                encoder_decoder=enc_dec,
                suppress_tokens=hook.suppress_tokens(self.tokenizer),
                begin_suppress_tokens=hook.begin_suppress_tokens(),
            ),
            self.kv,
        )
        self.runner = ModelRunner(
            loaded.model,
            num_layers=mc.num_layers,
            num_kv_heads=mc.num_kv_heads,
            head_size=mc.head_dim,
            vocab_size=mc.vocab_size,
            num_blocks=num_blocks,
            block_size=config.block_size,
            dtype=self.kv_cache_dtype,
            sliding_windows=mc.sliding_windows,
            fast_forward=config.structured_fast_forward,
            kv_groups=groups,
            batch_invariant=config.batch_invariant,
        )
        # structured outputs: requests held until their grammar compiles, and the grammars
        # the runner builds each choice's matcher from (never from the cache)
        self._held = HeldRequests(self.scheduler, config.structured_outputs_backend,
                                  self.grammar_cache, str(self.model_dir), self.vocab_size,
                                  tuple(self.eos_token_ids))
        self.runner.structured_masks = self._held.mask
        rules = hook.prompt_rules(self.tokenizer, tuple(self.eos_token_ids))
        if rules is not None:
            self.runner.timestamp_rules = _as_sampling_hooks(rules)
        self.lora: LoraAdapters | None = None
        if config.enable_lora:
            model = loaded.model
            self.lora = LoraAdapters(mc, config.max_loras, config.max_lora_rank,
                                     self._lora_ids_in_use,
                                     dtype=getattr(model, "compute_dtype", torch.float32),
                                     device=next(model.parameters()).device)
            self.runner.lora, self.runner.lora_slots = self.lora.stacks, self.lora.slots
        self.operator = Operator(self)
        log.info("engine ready in %.1f s", time.perf_counter() - t0)

    # ------------------------------------------------------------------ structured outputs

    def grammar_cache(self, backend: str | None = None) -> Any:
        """The process's GrammarCache for this model and ``backend`` (None: the engine's;
        built on first use, ~0.5 s; an in-process server has usually built it already)."""
        from actors.core.structured.cache import shared_cache

        return shared_cache(backend or self.config.structured_outputs_backend,
                            str(self.model_dir), self.tokenizer, self.vocab_size,
                            tuple(self.eos_token_ids))

    # ------------------------------------------------------------------ requests

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    arrival_time: float | None = None, priority: int | None = None,
                    lora_id: int = 0) -> None:
        """Queues a request its caller has checked (SamplingParams.validate and
        actors.params.prompt.check_prompt against RequestLimits.from_info(self.info), as
        LLM.generate does): the core trusts it, as it trusts any Admit."""
        self.add(Admit(
            request_id=request_id,
            prompt_token_ids=tuple(prompt_token_ids),
            params=params,
            arrival_time=time.monotonic() if arrival_time is None else arrival_time,
            priority=priority,
            lora_id=lora_id,
        ))

    def abort_request(self, request_id: str) -> list[RequestOutput]:
        out = self._held.abort(request_id)
        if out is not None:
            return out
        out = self.scheduler.abort(request_id)
        self._release_cross_kv()
        return out

    def has_unfinished_requests(self) -> bool:
        return self.has_unfinished()

    # ------------------------------------------------------------------ EngineCore

    @property
    def info(self) -> EngineInfo:
        c = self.config
        return EngineInfo(
            model_dir=str(self.model_dir),
            vocab_size=self.vocab_size,
            max_model_len=self.max_model_len,
            max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=c.max_num_batched_tokens,
            block_size=c.block_size,
            num_blocks=self.num_blocks,
            kv_cache_dtype=c.kv_cache_dtype,
            enable_prefix_caching=c.enable_prefix_caching,
            scheduling_policy=c.scheduling_policy,
            max_logprobs=c.max_logprobs,
            eos_token_ids=tuple(self.eos_token_ids),
            generation_defaults=tuple(self.generation_defaults.items()),
        )

    def add(self, admit: Admit) -> None:
        """Queues a checked prompt (EngineCore.add). Never compiles a grammar nor waits for
        one: a request whose grammar is still compiling is held until it has (a step then
        queues it, or ends it with "error" if the compile refused it; structured/held.py)."""
        if admit.lora_id and (self.lora is None or not self.lora.serves(admit.lora_id)):
            raise RequestRefused(f"LoRA adapter id {admit.lora_id} is not loaded")
        try:
            if admit.encoder_input is not None:
                admit.encoder_input.check(int(self.model_config.extra["num_mel_bins"]))
            if self._held.admit(admit):
                self.scheduler.add_request(admit)
        except RequestRefused:
            raise
        except ValueError as exc:
            raise RequestRefused(str(exc)) from exc

    def _lora_ids_in_use(self) -> set[int]:
        return {s.lora_id for seqs in self.scheduler._requests.values() for s in seqs}

    def abort(self, abort: Abort) -> None:
        if self._held.abort(abort.request_id, abort.index) is None:
            self.scheduler.abort(abort.request_id, abort.index)
            self._release_cross_kv()

    def _release_cross_kv(self) -> None:
        """An encoder-decoder's finished or aborted windows give their cross-attention K/V
        (tens of MB each) back at once, not with the next plan, which an idle engine never
        makes."""
        if self.runner.encoder_decoder:
            self.runner.release(self.scheduler.take_released())

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._held)

    def step(self) -> TokenBatch:
        sched = self.scheduler
        ended = self._held.admit_ready() if self._held else ()
        plan = sched.schedule()
        outputs = () if plan.is_empty else tuple(sched.update(self.runner.execute(plan)))
        if ended:
            outputs = (*ended, *outputs)
        self._release_cross_kv()
        if self.kv_events is not None:
            self._publish_kv_events()
        if self.operator.profiling:
            self.operator.after_step()
        return TokenBatch(outputs, tuple(sched.last_admitted), tuple(sched.last_preempted))

    def _publish_kv_events(self) -> None:
        events = self.kv.events.take()
        if events:
            self.kv_events.publish(events)

    def stats(self) -> EngineStats:
        s = self.scheduler.stats()
        return EngineStats(
            num_running=s.num_running,
            num_waiting=s.num_waiting + len(self._held),
            kv_usage=s.kv_usage,
            prefix_cache_queries=s.prefix_queried_tokens,
            prefix_cache_hits=s.prefix_hit_tokens,
            num_preemptions=s.num_preemptions,
        )

    def control(self, command: Control) -> ControlResult:
        """Operator commands between steps: ``reset_prefix_cache`` drops every cached
        block hash (blocks in use stay; they are simply not found again); sleep, wake,
        weights and the profiler are actors.core.operator's."""
        args = dict(command.args)
        op = self.operator
        match command.command:
            case "reset_prefix_cache":
                self.kv.reset_cache()
                if self.kv_events is not None:
                    self._publish_kv_events()
                return ControlResult(True)
            case "sleep":
                return op.sleep(int(args.get("level", 1)))
            case "wake_up":
                return op.wake_up(args.get("tags"))
            case "update_weights":
                return op.update_weights(str(args.get("path", "")))
            case "weight_info":
                return op.weight_info()
            case "linear_routing":
                table = self.linear_routing
                return ControlResult(True, None if table is None else table.as_dict())
            case "start_profile":
                return op.start_profile(args["config"], args.get("prefix"),
                                        args.get("max_iterations"))
            case "stop_profile":
                return op.stop_profile()
            case "load_lora_adapter" | "unload_lora_adapter" if self.lora is None:
                return ControlResult(False, error="LoRA is not enabled (--enable-lora)",
                                     reason="invalid")
            case "load_lora_adapter":
                return self.lora.load(int(args["lora_id"]), str(args["path"]))
            case "unload_lora_adapter":
                return self.lora.unload(int(args["lora_id"]))
        return ControlResult(False, error=f"unknown control command {command.command!r}")

    def default_sampling_params(self, **overrides: Any) -> SamplingParams:
        """SamplingParams with the model's generation defaults, then the overrides."""
        return SamplingParams(**{**self.generation_defaults, **overrides})


def _as_sampling_hooks(rules: Any) -> Any:
    """A model hook's per-prompt processors as the runner's sampling hooks."""
    from actors.core.runner.sampler import SamplingHooks

    def hooks(prompt: tuple[int, ...]) -> Any:
        processors = rules(prompt)
        return None if processors is None else SamplingHooks(logits_processors=processors)

    return hooks


def _kv_cache_dtype(name: str, model_dtype: Any) -> Any:
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


def _load_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))
