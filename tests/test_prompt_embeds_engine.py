"""Prompts given as embedding rows, in the engine core (--enable-prompt-embeds): the rows the
model's own embedding gives for a prompt's tokens generate what the tokens generate, whole or
in chunks, greedy, seeded with forked choices or by beam search, in this process or across
the engine process's pipe; the prefix cache finds them again only under the same rows; the
core refuses what it cannot run, naming the field."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from actors.config import EngineConfig
from actors.core.engine import LLMEngine
from actors.core.process import ProcessEngineCore
from actors.errors import RequestRefused
from actors.messages import Admit, Generate
from actors.params.embeds import PromptEmbeds
from actors.params.sampling import SamplingParams

pytestmark = pytest.mark.slow

MiB = 1 << 20
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
SAMPLED = SamplingParams(n=3, seed=11, temperature=1.0, max_tokens=6, ignore_eos=True)
BEAMS = SamplingParams(n=3, use_beam_search=True, max_tokens=6)
# About 60 tokens: three full blocks of 16 can be prefix-cache hits.
LONG = ("A parcel left the depot on Monday, crossed two borders, waited at customs and "
        "reached the sorting centre on Thursday. ") * 3


def config(loaded: Any, **kw: Any) -> EngineConfig:
    return EngineConfig(**{"model": str(loaded.source), "dtype": "float32",
                           "kv_cache_memory": 64 * MiB, "max_model_len": 256,
                           "num_threads": 1, "enable_prompt_embeds": True, **kw})


@pytest.fixture(scope="module")
def loaded(default_model: tuple[Any, float]) -> Any:
    return default_model[0]


@pytest.fixture(scope="module")
def engine(loaded: Any) -> LLMEngine:
    return LLMEngine(config(loaded), loaded=loaded)


def ids_of(engine: LLMEngine, text: str) -> list[int]:
    return engine.tokenizer.encode(text, add_special_tokens=False)


def rows_of(engine: LLMEngine, ids: list[int]) -> PromptEmbeds:
    with torch.inference_mode():
        return PromptEmbeds.of(engine.loaded.model.embed(torch.tensor(ids)).numpy())


def run(engine: Any, rid: str, ids: list[int], params: SamplingParams,
        embeds: PromptEmbeds | None = None) -> tuple[dict[int, list[int]], int]:
    """Each choice's tokens, and the prompt tokens the prefix cache gave."""
    prompt = ids if embeds is None else embeds.placeholder_ids()
    engine.add(Admit(rid, tuple(prompt), Generate(params, 0, embeds), time.monotonic()))
    out: dict[int, list[int]] = {}
    cached = 0
    while engine.has_unfinished():
        for o in engine.step().outputs:
            out.setdefault(o.index, []).extend(o.new_token_ids)
            cached = max(cached, o.num_cached_tokens)
    return out, cached


@pytest.mark.parametrize("params", [GREEDY, SAMPLED, BEAMS],
                         ids=["greedy", "seeded-n3", "beams-3"])
def test_rows_generate_what_their_tokens_generate(engine, params) -> None:
    ids = ids_of(engine, "The capital of France is")
    want, _ = run(engine, "tokens", ids, params)
    got, _ = run(engine, "rows", ids, params, rows_of(engine, ids))
    assert got == want and len(got) == params.n


def test_rows_split_over_chunks(loaded) -> None:
    # 16 tokens a step: the prompt's rows are fed chunk by chunk, from each chunk's start.
    small = LLMEngine(config(loaded, max_num_batched_tokens=16, enable_prefix_caching=False),
                      loaded=loaded)
    ids = ids_of(small, LONG)
    assert len(ids) > 40
    want, _ = run(small, "tokens", ids, GREEDY)
    got, _ = run(small, "rows", ids, GREEDY, rows_of(small, ids))
    assert got == want


def test_prefix_cache_keys_rows_by_their_content(engine) -> None:
    ids = ids_of(engine, LONG)
    rows = rows_of(engine, ids)
    first, hit0 = run(engine, "a", ids, GREEDY, rows)
    again, hit1 = run(engine, "b", ids, GREEDY, PromptEmbeds.of(rows.data.copy()))
    assert again == first and hit0 == 0 and hit1 >= 32
    # the placeholder ids alone, and other rows, find nothing of it
    _, hit = run(engine, "zeros", rows.placeholder_ids(), GREEDY)
    assert hit == 0
    other = rows.data.copy()
    other[0] += 0.5
    _, hit = run(engine, "other", ids, GREEDY, PromptEmbeds.of(other))
    assert hit == 0


def test_the_core_refuses_what_it_cannot_run(loaded, engine) -> None:
    ids = ids_of(engine, "Hello there")
    rows = rows_of(engine, ids)
    off = LLMEngine(config(loaded, enable_prompt_embeds=False), loaded=loaded)
    assert off.info.prompt_embeds_width == 0
    assert engine.info.prompt_embeds_width == loaded.config.hidden_size
    cases = [
        (off, rows.placeholder_ids(), GREEDY, rows, "prompt_embeds", "--enable-prompt-embeds"),
        (engine, [0], GREEDY, rows, "prompt_embeds", "rows for a prompt of 1"),
        (engine, rows.placeholder_ids(), GREEDY, PromptEmbeds.of(rows.data[:, :-1]),
         "prompt_embeds", "wide"),
        (engine, rows.placeholder_ids(), SamplingParams(max_tokens=2, prompt_logprobs=0),
         rows, "prompt_logprobs", "not compatible with prompt embeds"),
    ]
    for core, prompt, params, embeds, param, text in cases:
        with pytest.raises(RequestRefused) as caught:
            core.add(Admit("x", tuple(prompt), Generate(params, 0, embeds), 0.0))
        assert caught.value.param == param and text in caught.value.message
    assert not engine.has_unfinished()


def test_rows_cross_the_engine_process_boundary(loaded, engine) -> None:
    ids = ids_of(engine, "Once upon a time")
    rows = rows_of(engine, ids)
    want, _ = run(engine, "here", ids, SAMPLED, rows)
    with ProcessEngineCore(config(loaded)) as core:
        got, _ = run(core, "there", ids, SAMPLED, rows)
    assert got == want
