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
from actors.messages import Logprobs
from actors.params.sampling import SamplingParams

__all__ = ["LLM", "CompletionOutput", "GenerationOutput"]


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[Logprobs] | None
    finish_reason: str | None
    stop_reason: int | None = None


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

        Text is decoded once at the end with the request's skip_special_tokens. Stop
        strings are not applied here (the server's detokenizer handles them).
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

        results: dict[str, GenerationOutput] = {}
        order: list[str] = []
        for prompt, sp in zip(prompts, params):
            rid = str(next(self._ids))
            if isinstance(prompt, str):
                ids = self.tokenizer.encode(prompt, add_special_tokens=False)
                text = prompt
            else:
                ids, text = list(prompt), None
            self.engine.add_request(rid, ids, sp)
            results[rid] = GenerationOutput(
                rid, text, ids,
                [CompletionOutput(i, "", [], [] if sp.logprobs is not None else None, None)
                 for i in range(sp.n)],
            )
            order.append(rid)

        done = 0
        t0 = time.perf_counter()
        while self.engine.has_unfinished_requests():
            for out in self.engine.step().outputs:
                res = results[out.request_id]
                co = res.outputs[out.index]
                co.token_ids.extend(out.new_token_ids)
                if co.logprobs is not None and out.new_logprobs:
                    co.logprobs.extend(out.new_logprobs)
                res.num_cached_tokens = out.num_cached_tokens
                if out.prompt_logprobs is not None:
                    res.prompt_logprobs = list(out.prompt_logprobs)
                if out.finished:
                    co.finish_reason = out.finish_reason
                    co.stop_reason = out.stop_reason
                    done += 1
            if use_tqdm:
                print(f"\rgenerate: {done} sequences done, {time.perf_counter() - t0:.1f} s",
                      end="", file=sys.stderr)
        if use_tqdm:
            print(file=sys.stderr)

        for rid, sp in zip(order, params):
            for co in results[rid].outputs:
                co.text = self.tokenizer.decode(co.token_ids,
                                                skip_special_tokens=sp.skip_special_tokens)
        return [results[rid] for rid in order]
