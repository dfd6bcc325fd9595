"""LLM: the offline batch API, shaped like vLLM's ``LLM``.

    from actors import LLM, SamplingParams
    llm = LLM()                      # the default SmolLM2 model
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=32, temperature=0))
    outs[0].outputs[0].text
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from actors.core.engine import EngineConfig, LLMEngine
from actors.messages import Abort, Logprobs
from actors.params.limits import RequestLimits
from actors.params.prompt import check_prompt
from actors.params.sampling import SamplingParams
from actors.text.detokenizer import IncrementalDetokenizer

__all__ = ["LLM", "CompletionOutput", "GenerationOutput"]


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[Logprobs] | None
    finish_reason: str | None
    stop_reason: int | str | None = None  # the stop token id, or the stop string matched


@dataclass(slots=True)
class GenerationOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    num_cached_tokens: int = 0
    # With SamplingParams.prompt_logprobs: one entry per prompt token, the first None.
    prompt_logprobs: list[Logprobs | None] | None = None

    @property
    def finished(self) -> bool:
        return all(o.finish_reason is not None for o in self.outputs)


Prompt = str | list[int]


class LLM:
    def __init__(self, model: str | None = None, *, loaded=None, **engine_args) -> None:
        """engine_args are EngineConfig fields; ``loaded`` reuses already loaded weights."""
        self.engine = LLMEngine(EngineConfig(model=model, **engine_args), loaded=loaded)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def get_default_sampling_params(self) -> SamplingParams:
        return self.engine.default_sampling_params()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
    ) -> list[GenerationOutput]:
        """Runs every prompt to completion; results come back in prompt order.

        Text comes from the detokenizer the server uses, one per choice, fed each step's
        new tokens: a stop string ends its choice there (the core is told to abort it), with
        finish_reason "stop" and stop_reason the string, so the text, the reason and the
        token ids are what the server would answer.
        """
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = (
            [sampling_params] * len(prompts)
            if isinstance(sampling_params, SamplingParams)
            else list(sampling_params)
        )
        if len(params) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        # The server's checks (SamplingParams.validate once per distinct params, then
        # check_prompt), all before anything is queued: a refusal raises the server's typed
        # error, with its message and param, and leaves the engine as it was.
        limits = RequestLimits.from_info(self.engine.info)
        for sp in {id(sp): sp for sp in params}.values():
            sp.validate(limits)
        prepared = []
        for prompt, sp in zip(prompts, params):
            if isinstance(prompt, str):
                ids, text = self.tokenizer.encode(prompt, add_special_tokens=False), prompt
            else:
                ids, text = list(prompt), None
            prepared.append((check_prompt(ids, sp, limits), text))

        results: dict[str, GenerationOutput] = {}
        order: list[str] = []
        detoks: dict[tuple[str, int], IncrementalDetokenizer] = {}
        backend = self.tokenizer.backend_tokenizer
        for (ids, text), sp in zip(prepared, params):
            rid = str(next(self._ids))
            self.engine.add_request(rid, ids, sp)
            results[rid] = GenerationOutput(
                rid, text, ids,
                [CompletionOutput(i, "", [], [] if sp.wants_logprobs else None, None)
                 for i in range(sp.n)],
            )
            order.append(rid)
            for i in range(sp.n):
                detoks[rid, i] = IncrementalDetokenizer(
                    backend,
                    prompt_token_ids=ids,
                    skip_special_tokens=sp.skip_special_tokens,
                    # a beam search has no stop strings and never shows its EOS (vLLM)
                    stop=() if sp.use_beam_search else sp.stop,
                    include_stop_str_in_output=(sp.include_stop_str_in_output
                                                and not sp.use_beam_search),
                )

        engine = self.engine
        done = 0
        t0 = time.perf_counter()
        while engine.has_unfinished():
            for out in engine.step().outputs:
                res = results[out.request_id]
                co = res.outputs[out.index]
                if co.finish_reason is not None:
                    continue  # ended by a stop string; the core was told
                co.token_ids.extend(out.new_token_ids)
                if co.logprobs is not None and out.new_logprobs:
                    co.logprobs.extend(out.new_logprobs)
                res.num_cached_tokens = out.num_cached_tokens
                if out.prompt_logprobs is not None:
                    res.prompt_logprobs = list(out.prompt_logprobs)
                detok = detoks[out.request_id, out.index]
                piece = detok.add(list(out.new_token_ids),
                                  ends_on_stop_token=out.stopped_on_token)
                co.text += piece.text
                if piece.stop_reason is not None:
                    # The string wins over whatever else ended the choice in this step.
                    co.finish_reason, co.stop_reason = "stop", piece.stop_reason
                    if not out.finished:
                        engine.abort(Abort(out.request_id, out.index))
                    done += 1
                elif out.finished:
                    co.text += detok.flush()
                    co.finish_reason = out.finish_reason
                    co.stop_reason = out.stop_reason
                    done += 1
            if use_tqdm:
                print(f"\rgenerate: {done} sequences done, {time.perf_counter() - t0:.1f} s",
                      end="", file=sys.stderr)
        if use_tqdm:
            print(file=sys.stderr)
        return [results[rid] for rid in order]
