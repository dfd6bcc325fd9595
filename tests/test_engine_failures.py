"""The engine's failure path is per request, on the real default model.

- A prompt several times --max-num-batched-tokens: its first steps carry only mid-prompt
  chunks (no row samples), and the output equals the unchunked run.
- A value validation lets through but the core cannot take (float32 / int32) is refused at
  add_request, not inside a step.
- A row the core still refuses at run time (built below validation) fails only its own
  request; the other rows of the same steps finish as they would alone.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from actors import LLM, SamplingParams
from actors.messages import Admit, Generate
from actors.params.sampling import SamplingParamsError
import test_engine
from test_engine import loaded  # noqa: F401 - the module-scoped fixture

pytestmark = pytest.mark.slow

PASSAGE = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, counting each "
    "of the one hundred and twelve steps, trimming the wick and polishing the great lens "
    "until it shone. Ships passing the rocky point relied on its beam through fog and storm. "
)


def make_llm(loaded: Any, **overrides: Any) -> LLM:
    return test_engine.make_llm(loaded, **{"max_model_len": 4096, **overrides})


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


@pytest.fixture(scope="module")
def base(loaded: Any) -> LLM:
    return make_llm(loaded)


def long_prompt(llm: LLM, num_tokens: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < num_tokens:
        ids += llm.tokenizer.encode(PASSAGE, add_special_tokens=False)
    return ids[:num_tokens]


def test_prompt_several_times_the_token_budget(loaded: Any, base: LLM) -> None:
    prompt = long_prompt(base, 1500)
    want = base.generate([prompt], greedy(12))[0].outputs[0].token_ids  # one 1500-row step
    chunked = make_llm(loaded, max_num_batched_tokens=256)
    steps_without_sampling = 0
    engine = chunked.engine
    engine.add_request("long", prompt, greedy(12))
    outputs: list[int] = []
    while engine.has_unfinished_requests():
        step = engine.step().outputs
        if not step:
            steps_without_sampling += 1
        for out in step:
            outputs.extend(out.new_token_ids)
    assert steps_without_sampling == 5  # 5 chunks of 256 rows before the sampling one
    assert outputs == want
    # And beside decoding sequences, whose rows share the steps with the chunks.
    short = [base.tokenizer.encode(t, add_special_tokens=False)
             for t in ("The capital of France is", "List three colors:")]
    alone = [base.generate([p], greedy(24))[0].outputs[0].token_ids for p in short]
    mixed = chunked.generate([short[0], prompt, short[1]], [greedy(24), greedy(12), greedy(24)])
    assert [o.outputs[0].token_ids for o in mixed] == [alone[0], want, alone[1]]
    assert engine.stats().kv_usage == 0.0


@pytest.mark.parametrize("field,value", [
    ("top_p", 1e-46),  # 0.0 in float32
    ("repetition_penalty", 1e-46),
    ("top_p", 1e-40),  # a float32 subnormal
    ("top_k", 2**31),  # past int32
])
def test_generate_refuses_what_the_core_cannot_take(base: LLM, field: str,
                                                     value: object) -> None:
    # The offline LLM validates (the engine itself trusts what it is given, as any Admit).
    params = SamplingParams(temperature=1.0, seed=1, max_tokens=4, **{field: value})
    with pytest.raises(SamplingParamsError) as info:
        base.generate([[1, 2, 3]], params)
    assert info.value.param == field
    assert not base.engine.has_unfinished_requests()


def bypassing_validation(**fields: Any) -> SamplingParams:
    """SamplingParams holding values validate() refuses (as a bug above it might build)."""
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=8)
    for name, value in fields.items():
        object.__setattr__(params, name, value)
    return params


@pytest.mark.parametrize("bad", [
    dict(top_p=0.0),  # the core refuses the row
    dict(top_p=1e-46),
    dict(repetition_penalty=-1.0),
    dict(top_k=2**31),  # the row's columns cannot be built (int32)
    dict(min_p=2.0),  # out of [0, 1] (more logprobs than the vocabulary are capped to it)
    dict(n=2, top_p=0.0),  # a parent that never forks: both choices fail
])
def test_a_row_the_core_refuses_fails_only_its_request(base: LLM, bad: dict) -> None:
    engine = base.engine
    prompts = [base.tokenizer.encode(t, add_special_tokens=False)
               for t in ("The capital of France is", "def fibonacci(n):", "List three colors:")]
    want = [base.generate([p], greedy(10))[0].outputs[0].token_ids for p in prompts]
    seeded = SamplingParams(temperature=0.8, seed=3, max_tokens=10, ignore_eos=True)
    want_seeded = base.generate([prompts[0]], seeded)[0].outputs[0].token_ids

    engine.add_request("good-0", prompts[0], greedy(10))
    engine.add_request("good-1", prompts[1], greedy(10))
    # Below validation: straight into the scheduler, as add_request would after validate().
    engine.scheduler.add_request(Admit(request_id="bad", prompt_token_ids=tuple(prompts[2]),
                                       kind=Generate(bypassing_validation(**bad)),
                                       arrival_time=0.0))
    engine.add_request("good-2", prompts[2], greedy(10))
    engine.add_request("good-3", prompts[0], seeded)
    got: dict[str, list[int]] = {}
    finish: dict[tuple[str, int], str | None] = {}
    while engine.has_unfinished_requests():
        for out in engine.step().outputs:
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                finish[(out.request_id, out.index)] = out.finish_reason
    n = bad.get("n", 1)
    assert [finish[("bad", i)] for i in range(n)] == ["error"] * n
    assert got.get("bad", []) == []
    assert [got[f"good-{i}"] for i in range(3)] == want
    assert got["good-3"] == want_seeded
    assert all(finish[(f"good-{i}", 0)] == "length" for i in range(4))
    assert engine.stats().kv_usage == 0.0 and not engine.has_unfinished_requests()
    # The engine goes on serving.
    assert base.generate([prompts[1]], greedy(10))[0].outputs[0].token_ids == want[1]


def test_max_logprobs_is_the_engines_limit(loaded: Any) -> None:
    llm = make_llm(loaded, max_logprobs=3, max_model_len=256)
    prompt = llm.tokenizer.encode("Hello there", add_special_tokens=False)
    out = llm.generate([prompt], replace(greedy(2), logprobs=3))[0].outputs[0]
    assert [len(lp.top_token_ids) for lp in out.logprobs] == [3, 3]
    for field in ("logprobs", "prompt_logprobs"):
        with pytest.raises(SamplingParamsError) as info:
            llm.generate([prompt], replace(greedy(2), **{field: 4}))
        assert info.value.param == field and "max allowed: 3" in info.value.message
