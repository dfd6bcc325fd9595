"""LLMEngine: the engine core's façade, stepped synchronously (``EngineCore``).

core/build.py assembles the parts (model, scheduler, KV manager, runner, held structured
requests, LoRA); this class routes requests into them by kind and steps them. The model
family's own rules arrive through its hook (models/hooks.py), the operator commands go to
core/operator.py, which reaches back only through the ``EngineHost`` verbs below.

The HTTP server drives the same object from the engine actor (or its child-process twin,
core/process.py); the offline ``LLM`` API and the benchmarks call ``step()`` in a loop.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from actors.config import EngineConfig  # re-exported
from actors.core.build import build_parts
from actors.core.operator import Operator, WeightOrigin
from actors.errors import RequestRefused
from actors.core.structured.cache import shared_compiles
from actors.core.structured.prepared import PreparedGrammars
from actors.messages import Abort, Admit, Control, ControlResult, EngineInfo, EngineStats
from actors.messages import Generate, GrammarVerdict, PrepareGrammar, RequestOutput, TokenBatch
from actors.params.sampling import SamplingParams

if TYPE_CHECKING:
    import torch

    from actors.core.structured.cache import GrammarCache
    from actors.loader import LoadedModel

__all__ = ["EngineConfig", "LLMEngine"]

log = logging.getLogger("actors.core.engine")


class LLMEngine:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        """Loads config.model, or reuses ``loaded`` when given: several engines may share
        one set of weights (tests, benchmarks)."""
        t0 = time.perf_counter()
        p = build_parts(config, loaded, self.grammar_cache, self._lora_ids_in_use)
        self.config, self.loaded, self.linear_routing = p.config, p.loaded, p.linear_routing
        self.model_config, self.model_dir, self.dtype = p.model_config, p.model_dir, p.dtype
        self.kv_cache_dtype, self.max_model_len = p.kv_cache_dtype, p.max_model_len
        self.tokenizer, self.eos_token_ids = p.tokenizer, p.eos_token_ids
        self.vocab_size, self.generation_defaults = p.info.vocab_size, p.generation_defaults
        self.kv_groups, self.num_blocks, self.kv, self.kv_events = (p.kv_groups, p.num_blocks,
                                                                    p.kv, p.kv_events)
        self.scheduler, self.runner, self._held, self.lora = p.scheduler, p.runner, p.held, p.lora
        self._hook, self._info = p.hook, p.info
        self.origin = WeightOrigin(self.model_dir, self.dtype, config.quantization,
                                   self.loaded.source)
        self.operator = Operator(self)
        self._grammar_key = (str(self.model_dir), self.vocab_size, tuple(self.eos_token_ids))
        self._prepared = PreparedGrammars(config.structured_outputs_backend, self.grammar_cache,
                                          *self._grammar_key)
        log.info("engine ready in %.1f s", time.perf_counter() - t0)

    def grammar_cache(self, backend: str | None = None) -> GrammarCache:
        """The process's GrammarCache for this model and ``backend`` (None: the engine's;
        built on first use, ~0.5 s; an in-process server has usually built it already)."""
        from actors.core.structured.cache import shared_cache

        return shared_cache(backend or self.config.structured_outputs_backend,
                            str(self.model_dir), self.tokenizer, self.vocab_size,
                            tuple(self.eos_token_ids))

    # ------------------------------------------------------------------ offline requests

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    arrival_time: float | None = None, priority: int | None = None,
                    lora_id: int = 0) -> None:
        """Queues a generation request its caller has checked (SamplingParams.validate and
        actors.params.prompt.check_prompt against RequestLimits.from_info(self.info), as
        LLM.generate does): the core trusts it, as it trusts any Admit."""
        self.add(Admit(request_id, tuple(prompt_token_ids), Generate(params, lora_id),
                       time.monotonic() if arrival_time is None else arrival_time, priority))

    def abort_request(self, request_id: str) -> list[RequestOutput]:
        out = self._held.abort(request_id)
        if out is not None:
            return out
        out = self.scheduler.abort(request_id)
        self._release_cross_kv()
        return out

    def has_unfinished_requests(self) -> bool:
        return self.has_unfinished()

    def default_sampling_params(self, **overrides: Any) -> SamplingParams:
        """SamplingParams with the model's generation defaults, then the overrides."""
        return SamplingParams(**{**self.generation_defaults, **overrides})

    # ------------------------------------------------------------------ EngineCore

    @property
    def info(self) -> EngineInfo:
        return self._info

    def add(self, admit: Admit) -> None:
        """Queues a checked prompt (EngineCore.add). Never compiles a grammar nor waits for
        one: a request whose grammar is still compiling is held until it has (a step then
        queues it, or ends it with "error" if the compile refused it; structured/held.py)."""
        kind = admit.kind
        if isinstance(kind, Generate) and kind.lora_id and (
                self.lora is None or not self.lora.serves(kind.lora_id)):
            raise RequestRefused(f"LoRA adapter id {kind.lora_id} is not loaded")
        if isinstance(kind, Generate) and kind.prompt_embeds is not None:
            self._check_embeds(kind, len(admit.prompt_token_ids))
        try:
            self._hook.check(kind)  # the model family's own checks (an encoder input's shape)
            if self._held.admit(admit):
                self.scheduler.add_request(admit)
        except RequestRefused:
            raise
        except ValueError as exc:
            raise RequestRefused(str(exc)) from exc

    def _check_embeds(self, kind: Generate, num_tokens: int) -> None:
        """Refuses prompt embeddings this engine cannot run (the front end's checks, again
        at the core's boundary: an offline caller reaches it directly)."""
        width = self._info.prompt_embeds_width
        if not width:
            raise RequestRefused("You must set `--enable-prompt-embeds` to input "
                                 "`prompt_embeds`.", param="prompt_embeds")
        if kind.params.prompt_logprobs is not None:
            raise RequestRefused("prompt_logprobs is not compatible with prompt embeds.",
                                 param="prompt_logprobs")
        try:
            kind.prompt_embeds.check(width, num_tokens)
        except ValueError as exc:
            raise RequestRefused(str(exc), param="prompt_embeds") from None

    def abort(self, abort: Abort) -> None:
        if self._held.abort(abort.request_id, abort.index) is None:
            self.scheduler.abort(abort.request_id, abort.index)
            self._release_cross_kv()

    async def prepare_grammar(self, request: PrepareGrammar) -> GrammarVerdict:
        """Compiles a constraint before admission, on the grammar cache's workers, and pins
        it for ``add`` (EngineCore.prepare_grammar; actors.core.structured.prepared)."""
        return await self._prepared.prepare(request)

    def release_grammar(self, pin: int) -> None:
        self._prepared.release(pin)

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
        return TokenBatch(outputs, tuple(sched.last_admitted), tuple(sched.last_preempted),
                          self.operator.weights.version)

    def stats(self) -> EngineStats:
        s = self.scheduler.stats()
        return EngineStats(num_running=s.num_running, num_waiting=s.num_waiting + len(self._held),
                           kv_usage=s.kv_usage, prefix_cache_queries=s.prefix_queried_tokens,
                           prefix_cache_hits=s.prefix_hit_tokens,
                           num_preemptions=s.num_preemptions,
                           grammar_compiles=shared_compiles(*self._grammar_key))

    def control(self, command: Control) -> ControlResult:
        """Operator commands between steps (actors.core.operator)."""
        return self.operator.control(command)

    # ------------------------------------------------------------------ EngineHost

    def reset_prefix_cache(self, *, publish: bool) -> None:
        self.kv.reset_cache()
        if publish and self.kv_events is not None:
            self._publish_kv_events()

    def free_kv_cache(self) -> None:
        self.runner.free_kv_cache()
        self.kv.reset_cache()  # the cached prefixes' KV is gone

    def reset_encoder_cache(self) -> int:
        """An encoder-decoder's cross-attention K/V pool, dropped when idle (bytes freed)."""
        return self.runner.reset_cross_kv() if self.runner.encoder_decoder else 0

    def restore_kv_cache(self) -> None:
        self.runner.allocate_kv_cache()

    def swap_model(self, model: torch.nn.Module | None) -> None:
        """Serves ``model`` from the next step (None: sleep level 2 dropped it)."""
        self.runner.model = model
        self.loaded = dataclasses.replace(self.loaded, model=model)
        if model is not None and self.linear_routing is not None:  # the same shapes
            self.linear_routing = model.route_linears(table=self.linear_routing)

    # ------------------------------------------------------------------ internals

    def _lora_ids_in_use(self) -> set[int]:
        return {s.lora_id for seqs in self.scheduler._requests.values() for s in seqs}

    def _release_cross_kv(self) -> None:
        """An encoder-decoder's finished or aborted windows give their cross-attention K/V
        (tens of MB each) back at once, not with the next plan, which an idle engine never
        makes."""
        if self.runner.encoder_decoder:
            self.runner.release(self.scheduler.take_released())

    def _publish_kv_events(self) -> None:
        events = self.kv.events.take()
        if events:
            self.kv_events.publish(events)
