"""Fast-forward of grammar-forced tokens: the same outputs as drawing every token, in fewer
model steps.

A forced token is the only one a choice's mask allows, so the masked sampler draws it
whatever the logits and the seed, and draws are keyed by (seed, position): taking forced
tokens without their model steps must leave every output token, finish reason and seeded
draw unchanged. These tests run the real model offline twice over the same weights, with
fast-forward on and off, and compare.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from actors.core.structured.mask import MatcherMask, _single_token
from actors.llm import LLM
from actors.params.sampling import SamplingParams
from actors.params.structured import StructuredSpec

MiB = 1 << 20

# The benchmark's schema (long fixed keys, an enum): many positions where one token is all
# the grammar allows.
_BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench_fast_forward.py"
_spec = importlib.util.spec_from_file_location("bench_fast_forward", _BENCH)
assert _spec is not None and _spec.loader is not None
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)
SCHEMA = _bench.SCHEMA
SPEC = StructuredSpec("json", json.dumps(SCHEMA))
QUESTIONS = ["Give me an order record as JSON.", "Describe a parcel order.",
             "Fill in the delivery form for Ana.", "One more order, please."]


@pytest.fixture(scope="module")
def loaded(default_model: tuple[Any, float]) -> Any:
    return default_model[0]


def make_llm(loaded: Any, fast_forward: bool, **overrides: Any) -> LLM:
    args: dict[str, Any] = dict(dtype="float32", kv_cache_memory=128 * MiB, max_model_len=1024,
                                structured_fast_forward=fast_forward)
    args.update(overrides)
    return LLM(str(loaded.source), loaded=loaded, **args)


@pytest.fixture(scope="module")
def pair(loaded: Any) -> tuple[LLM, LLM]:
    return make_llm(loaded, True), make_llm(loaded, False)


def prompts(llm: LLM) -> list[str]:
    return [llm.tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                              add_generation_prompt=True, tokenize=False)
            for q in QUESTIONS]


def run(llm: LLM, params: SamplingParams) -> tuple[list[tuple[Any, ...]], int]:
    """(per prompt and choice: token ids, text, finish reason; model steps taken)."""
    before = llm.engine.scheduler.stats().num_steps
    outs = llm.generate(prompts(llm), params)
    steps = llm.engine.scheduler.stats().num_steps - before
    got = [(tuple(c.token_ids), c.text, c.finish_reason) for o in outs for c in o.outputs]
    return got, steps


def test_greedy_outputs_equal_in_fewer_steps(pair: tuple[LLM, LLM]) -> None:
    on, off = pair
    params = SamplingParams(temperature=0.0, max_tokens=160, structured=SPEC)
    got_on, steps_on = run(on, params)
    got_off, steps_off = run(off, params)
    assert got_on == got_off
    for ids, text, reason in got_on:
        assert reason == "stop", text
        doc = json.loads(text)
        assert set(doc) == set(SCHEMA["required"])
    # the forced keys and punctuation are a large share of these outputs
    assert steps_on < 0.8 * steps_off, (steps_on, steps_off)


def test_seeded_sampling_and_n_equal(pair: tuple[LLM, LLM]) -> None:
    on, off = pair
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=11, n=2, max_tokens=160,
                            structured=SPEC)
    got_on, _ = run(on, params)
    got_off, _ = run(off, params)
    assert got_on == got_off
    assert len(got_on) == 2 * len(QUESTIONS)


def test_max_tokens_cut_inside_a_forced_run(pair: tuple[LLM, LLM]) -> None:
    on, off = pair
    # each cut lands somewhere in the output; some inside a forced key
    for max_tokens in (3, 7, 12, 20):
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, structured=SPEC)
        got_on, _ = run(on, params)
        got_off, _ = run(off, params)
        assert got_on == got_off, max_tokens
        for ids, _text, reason in got_on:
            assert len(ids) == max_tokens and reason == "length"


def test_stop_string_inside_a_forced_run(pair: tuple[LLM, LLM]) -> None:
    on, off = pair
    params = SamplingParams(temperature=0.0, max_tokens=160, structured=SPEC,
                            stop=["delivery"])
    got_on, _ = run(on, params)
    got_off, _ = run(off, params)
    assert [(t, r) for _, t, r in got_on] == [(t, r) for _, t, r in got_off]
    assert all("delivery" not in t and r == "stop" for _, t, r in got_on)


def test_logprobs_requests_take_every_step(pair: tuple[LLM, LLM]) -> None:
    on, _ = pair
    params = SamplingParams(temperature=0.0, max_tokens=40, structured=SPEC, logprobs=1)
    out = on.generate(prompts(on)[:1], params)[0].outputs[0]
    # one logprob entry per token: no token came without its own draw
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)


def test_preempted_fast_forward_resumes_equal(loaded: Any) -> None:
    # A KV pool too small for every prompt at once: sequences are preempted and recomputed,
    # forced tokens included, and the mask rolls back what the recompute replays.
    on = make_llm(loaded, True, max_num_seqs=4, max_model_len=256, kv_cache_memory=13 * MiB)
    off = make_llm(loaded, False, max_num_seqs=4, max_model_len=256, kv_cache_memory=13 * MiB)
    params = SamplingParams(temperature=0.0, max_tokens=120, structured=SPEC)
    got_on, _ = run(on, params)
    got_off, _ = run(off, params)
    assert got_on == got_off
    assert on.engine.scheduler.stats().num_preemptions > 0


def test_single_token() -> None:
    row = np.zeros(4, np.int32)
    assert _single_token(row) is None
    row.view(np.uint32)[2] = np.uint32(1 << 31)
    assert _single_token(row) == 2 * 32 + 31
    row.view(np.uint32)[0] = 1
    assert _single_token(row) is None
    row[:] = 0
    row.view(np.uint32)[1] = 0b1010
    assert _single_token(row) is None


def test_look_ahead_row_serves_the_next_fill(pair: tuple[LLM, LLM]) -> None:
    on, _ = pair
    cache = on.engine.grammar_cache()
    vocab = on.engine.info.vocab_size
    mask = MatcherMask(cache.get(SPEC), cache.backend.vocab_size, vocab,
                       tuple(on.engine.eos_token_ids))
    words = (vocab + 31) // 32
    forced = mask.fast_forward(64, lambda t: True)
    # at the start of an object only "{" (perhaps with whitespace) can come
    text = on.tokenizer.decode(forced)
    assert text.strip() in ("", "{"), text
    ahead = np.full(words, -1, np.int32)
    mask.fill_bitmask(ahead)  # served from the look-ahead
    fresh = MatcherMask(cache.get(SPEC), cache.backend.vocab_size, vocab,
                        tuple(on.engine.eos_token_ids))
    fresh.replay(forced)
    direct = np.full(words, -1, np.int32)
    fresh.fill_bitmask(direct)
    assert np.array_equal(ahead, direct)


def test_request_backend_routes_to_its_cache(pair: tuple[LLM, LLM]) -> None:
    # a spec that names its backend (guided_decoding_backend) is compiled and matched there
    pytest.importorskip("xgrammar", reason="xgrammar is an optional extra")
    import dataclasses

    on, _ = pair
    spec = dataclasses.replace(StructuredSpec("regex", r"[a-z]{3,6} [0-9]{2}"),
                               backend="xgrammar")
    out = on.generate(prompts(on)[:1], SamplingParams(temperature=0.0, max_tokens=20,
                                                       structured=spec))[0].outputs[0]
    import re
    assert re.fullmatch(r"[a-z]{3,6} [0-9]{2}", out.text), out.text
    assert spec in on.engine.grammar_cache("xgrammar")
    assert spec not in on.engine.grammar_cache()


def test_a_failing_matcher_ends_its_choice_only() -> None:
    # a backend error inside a fill (a matcher past its end, a resource limit) must not
    # fail the step: the row allows only EOS, so that choice ends
    from actors.core.structured.backend import Matcher

    class Broken(Matcher):
        def fill_bitmask(self, out_row):
            raise RuntimeError("matcher terminated")

        def accept(self, token_id):
            return True

        def rollback(self, k):
            pass

        def is_terminated(self):
            return False

        def forced_tokens(self):
            return []

        def validate_tokens(self, tokens):
            return 0

        def error(self):
            return None

        def is_accepting(self):
            return False

    mask = MatcherMask(Broken(), 64, 64, (5,))
    row = np.full(2, -1, np.int32)
    mask.fill_bitmask(row)
    assert _single_token(row) == 5
    assert mask.fast_forward(8, lambda t: True) == []  # EOS is never taken ahead
