"""The engine on the real default model: greedy output against transformers' generate, and
the same outputs under batching, chunked prefill, prefix-cache hits and preemption."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from actors import LLM, SamplingParams
from hf_reference import gguf_reference

pytestmark = pytest.mark.slow

MiB = 1 << 20

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "List three colors:",
    "The quick brown fox",
]
SYSTEM = (
    "You are a meticulous assistant for a shipping company. Answer questions about parcels, "
    "tracking numbers, customs forms and delivery windows. Keep answers short and factual."
)


@pytest.fixture(scope="module")
def loaded(default_model: tuple[Any, float]) -> Any:
    return default_model[0]


def make_llm(loaded: Any, **overrides: Any) -> LLM:
    args: dict[str, Any] = dict(dtype="float32", kv_cache_memory=256 * MiB, max_model_len=2048)
    args.update(overrides)
    return LLM(str(loaded.source), loaded=loaded, **args)


def token_ids(llm: LLM, texts: list[str]) -> list[list[int]]:
    return [llm.tokenizer.encode(t, add_special_tokens=False) for t in texts]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def generate_ids(llm: LLM, prompts: list[list[int]], params: Any) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def base(loaded: Any) -> LLM:
    return make_llm(loaded)


@pytest.fixture(scope="module")
def mixed_prompts(base: LLM) -> list[list[int]]:
    """16 prompts of mixed lengths (4 to ~150 tokens)."""
    texts = [p * (1 + (i % 4) * 3) for i, p in enumerate(PROMPTS * 4)][:16]
    return token_ids(base, texts)


@pytest.fixture(scope="module")
def alone(base: LLM, mixed_prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt's 24-token greedy continuation, computed alone."""
    return [generate_ids(base, [p], greedy(24))[0] for p in mixed_prompts]


def test_greedy_matches_transformers_generate(base: LLM, loaded: Any) -> None:
    new_tokens = 40  # tokens per prompt: transformers' own generate is most of the time here
    ref = gguf_reference(loaded.source)
    prompts = token_ids(base, PROMPTS)
    # min_tokens bans EOS exactly as transformers' min_new_tokens does.
    ours = generate_ids(base, prompts, SamplingParams(temperature=0.0, max_tokens=new_tokens,
                                                      min_tokens=new_tokens))
    for prompt, got in zip(prompts, ours):
        with torch.inference_mode():
            out = ref.generate(
                torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, temperature=None,
                top_p=None, top_k=None, output_scores=True, return_dict_in_generate=True,
                pad_token_id=0,
            )
        want = out.sequences[0, len(prompt):].tolist()
        assert len(got) == len(want) == new_tokens
        for i, (a, b) in enumerate(zip(got, want)):
            if a != b:
                # Allowed only where transformers' own top-2 logits are within tolerance;
                # after that the continuations legitimately diverge.
                top2 = out.scores[i][0].topk(2).values
                assert float(top2[0] - top2[1]) <= 1e-3, (i, a, b)
                break


def test_batch_of_16_matches_alone(base: LLM, mixed_prompts, alone) -> None:
    assert generate_ids(base, mixed_prompts, greedy(24)) == alone


def test_chunked_prefill_matches(loaded: Any, mixed_prompts, alone) -> None:
    llm = make_llm(loaded, max_num_batched_tokens=7, max_num_seqs=4)
    assert generate_ids(llm, mixed_prompts[:6], greedy(24)) == alone[:6]


def test_preemption_matches(loaded: Any, mixed_prompts, alone) -> None:
    # 40 blocks of 16 tokens hold one 256-token sequence, but not 16 sequences of
    # 4 to ~170 tokens growing by 24 each: running ones must be preempted and recomputed.
    per_block = 2 * 30 * 3 * 64 * 16 * 4
    llm = make_llm(loaded, kv_cache_memory=40 * per_block, max_model_len=256,
                   enable_prefix_caching=False)
    got = generate_ids(llm, mixed_prompts, greedy(24))
    assert llm.engine.stats().num_preemptions > 0
    assert got == alone


def test_prefix_cache_hits_match(loaded: Any) -> None:
    cached = make_llm(loaded)
    plain = make_llm(loaded, enable_prefix_caching=False)
    questions = ["Where is parcel 1234?", "How long does customs take?", "Can I change the date?"]
    prompts = token_ids(cached, [f"{SYSTEM}\n\nQ: {q}\nA:" for q in questions])
    want = generate_ids(plain, prompts, greedy(16))
    first = generate_ids(cached, prompts[:1], greedy(16))
    rest = generate_ids(cached, prompts[1:], greedy(16))
    assert first + rest == want
    stats = cached.engine.stats()
    assert stats.prefix_cache_hits >= 2 * 32  # the shared system prompt, twice


def test_seeded_sampling_same_alone_and_in_batch(base: LLM, mixed_prompts) -> None:
    params = SamplingParams(temperature=1.2, top_p=0.95, top_k=40, seed=1234, max_tokens=20,
                            ignore_eos=True)
    alone_ids = generate_ids(base, [mixed_prompts[2]], params)[0]
    others = SamplingParams(temperature=1.0, seed=7, max_tokens=20, ignore_eos=True)
    batch = base.generate(mixed_prompts[:8], [others] * 2 + [params] + [others] * 5)
    assert batch[2].outputs[0].token_ids == alone_ids
    # A different seed gives a different continuation (the seed is really used).
    other_seed = SamplingParams(temperature=1.2, top_p=0.95, top_k=40, seed=99, max_tokens=20,
                                ignore_eos=True)
    assert generate_ids(base, [mixed_prompts[2]], other_seed)[0] != alone_ids


def test_n_greater_than_one_and_logprobs(base: LLM) -> None:
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=8, logprobs=2,
                            ignore_eos=True)
    out = base.generate(["Tell me a story"], params)[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert all(len(o.token_ids) == 8 and o.finish_reason == "length" for o in out.outputs)
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1
    for o in out.outputs:
        assert o.logprobs is not None and len(o.logprobs) == 8
        assert all(lp.logprob <= 0 and len(lp.top_token_ids) == 2 for lp in o.logprobs)


def test_n_choices_fork_from_one_prefill_and_repeat(base: LLM) -> None:
    """The core owns n: one Admit, the prompt computed once (one prefix-cache lookup of
    the prompt, not 16), 16 distinct choices that repeat exactly under the same seed."""
    prompt = token_ids(base, [PROMPTS[2] * 3])[0]
    params = SamplingParams(n=16, seed=7, temperature=1.0, max_tokens=8, ignore_eos=True)
    runs = []
    for _ in range(2):
        before = base.engine.stats().prefix_cache_queries
        out = base.generate([prompt], params)[0]
        # An admission looks up every prompt token but the last (which must be computed).
        assert base.engine.stats().prefix_cache_queries - before == len(prompt) - 1
        runs.append([tuple(o.token_ids) for o in out.outputs])
    assert runs[0] == runs[1]
    assert len(set(runs[0])) == 16 and all(len(t) == 8 for t in runs[0])
    # Choice 0 samples with the request's own seed: the same tokens as n=1.
    one = SamplingParams(n=1, seed=7, temperature=1.0, max_tokens=8, ignore_eos=True)
    assert tuple(generate_ids(base, [prompt], one)[0]) == runs[0][0]
    other = SamplingParams(n=16, seed=8, temperature=1.0, max_tokens=8, ignore_eos=True)
    assert [tuple(o.token_ids) for o in base.generate([prompt], other)[0].outputs] != runs[0]
    assert base.engine.stats().kv_usage == 0.0


def test_eos_stops_and_blocks_return(base: LLM) -> None:
    chat = base.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say OK."}], tokenize=False, add_generation_prompt=True)
    out = base.generate([chat], SamplingParams(temperature=0.0, max_tokens=200))[0].outputs[0]
    assert out.finish_reason == "stop"
    assert len(out.token_ids) < 200
    pool = base.engine.kv.pool
    assert pool.num_free() == pool.num_blocks
    pool.check()


def test_kv_cache_dtype_bfloat16_holds_twice_the_tokens(loaded: Any, base: LLM) -> None:
    """A bf16 cache under an fp32 model: twice the blocks in the same memory, and next-token
    log-probabilities within bf16 rounding of the exact (fp32) cache.

    bf16 K/V move these logprobs by up to ~0.03 (measured 0.027 on the scalar, AVX2 and
    AVX-512 attention alike), so the best token may change only where the fp32 cache's two
    best are closer than 0.05: "The capital of France is" after SYSTEM is such a near-tie
    (" Paris" against " France", 0.043 apart), and there the bf16 winner must be one of the two."""
    assert base.engine.kv_cache_dtype == torch.float32  # auto: the model's dtype (float32 here)
    half = make_llm(loaded, kv_cache_dtype="bfloat16")
    assert half.engine.runner.k_caches[0].dtype == torch.bfloat16
    assert half.engine.num_blocks == 2 * base.engine.num_blocks
    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=5, ignore_eos=True)
    prompts = token_ids(base, [SYSTEM + " " + p for p in PROMPTS])
    for want, got in zip(base.generate(prompts, params), half.generate(prompts, params)):
        a, b = want.outputs[0].logprobs[0], got.outputs[0].logprobs[0]
        if a.top_logprobs[0] - a.top_logprobs[1] < 0.05:
            assert b.top_token_ids[0] in a.top_token_ids[:2]
        else:
            assert a.top_token_ids[0] == b.top_token_ids[0]
        assert abs(a.logprob - b.logprob) < 0.05
        assert set(a.top_token_ids[:3]) <= set(b.top_token_ids)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        make_llm(loaded, kv_cache_dtype="fp8")


def reference_prompt_logprobs(loaded: Any, prompt: list[int]) -> torch.Tensor:
    """log_softmax of transformers' logits: row p scores prompt token p + 1."""
    ref = gguf_reference(loaded.source)
    with torch.inference_mode():
        logits = ref(torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def check_prompt_logprobs(got: Any, prompt: list[int], ref: torch.Tensor, k: int) -> None:
    assert got is not None and len(got) == len(prompt)
    assert got[0] is None
    for i in range(1, len(prompt)):
        lp = got[i]
        want = ref[i - 1]
        assert abs(lp.logprob - float(want[prompt[i]])) < 1e-3, i
        assert lp.rank == int((want >= want[prompt[i]]).sum()) or abs(
            float(want.sort(descending=True).values[lp.rank - 1]) - lp.logprob) < 1e-3, i
        top = want.topk(k)
        assert len(lp.top_token_ids) == k
        assert list(lp.top_logprobs) == pytest.approx(top.values.tolist(), abs=1e-3)
        assert lp.top_token_ids[0] == int(top.indices[0]) or abs(
            float(want[lp.top_token_ids[0]]) - float(top.values[0])) < 1e-3


def test_prompt_logprobs_match_transformers(loaded: Any) -> None:
    """Whole prompt in one step, with the prompt's blocks already in the prefix cache, and
    in chunks of 7 tokens beside other prompts: it is computed every time and scores the
    same as transformers."""
    llm = make_llm(loaded)
    prompt = token_ids(llm, [f"{SYSTEM}\n\nQ: Where is parcel 1234?\nA:"])[0]
    ref = reference_prompt_logprobs(loaded, prompt)
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=3)
    first = llm.generate([prompt], params)[0]
    check_prompt_logprobs(first.prompt_logprobs, prompt, ref, 3)
    assert first.outputs[0].token_ids  # generation still runs

    # Warm cache: a plain request hits, one asking for prompt logprobs does not.
    plain = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1))[0]
    assert plain.num_cached_tokens >= 32 and plain.prompt_logprobs is None
    warm = llm.generate([prompt], params)[0]
    assert warm.num_cached_tokens == 0
    check_prompt_logprobs(warm.prompt_logprobs, prompt, ref, 3)
    assert warm.outputs[0].token_ids == first.outputs[0].token_ids

    chunked = make_llm(loaded, max_num_batched_tokens=7, max_num_seqs=4)
    other = token_ids(llm, PROMPTS[2:4])
    outs = chunked.generate([prompt, *other], [params] + [SamplingParams(max_tokens=3)] * 2)
    check_prompt_logprobs(outs[0].prompt_logprobs, prompt, ref, 3)
    assert outs[1].prompt_logprobs is None


def test_prompt_logprobs_once_per_request(base: LLM) -> None:
    """n > 1 scores its prompt once; k = 0 gives each token's own logprob and rank only;
    a one-token prompt has the single None entry."""
    prompt = token_ids(base, ["The quick brown fox jumps over the lazy dog"])[0]
    out = base.generate([prompt], SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=4,
                                                 prompt_logprobs=0))[0]
    pl = out.prompt_logprobs
    assert pl is not None and len(pl) == len(prompt) and pl[0] is None
    assert all(e.top_token_ids == () and e.rank >= 1 and e.logprob <= 0 for e in pl[1:])
    assert [len(o.token_ids) for o in out.outputs] == [4, 4, 4]
    one = base.generate([prompt[:1]], SamplingParams(max_tokens=1, prompt_logprobs=2))[0]
    assert one.prompt_logprobs == [None]


def test_cache_salt_separates_prefix_cache(loaded: Any) -> None:
    """Same prompt: a different salt (or none) never hits a salted request's blocks, the
    same salt does, and the output is the same either way."""
    llm = make_llm(loaded)
    prompt = token_ids(llm, [f"{SYSTEM}\n\nQ: Where is parcel 1234?\nA:"])[0]
    full = (len(prompt) - 1) // llm.engine.config.block_size * llm.engine.config.block_size
    assert full >= 32
    cached, outputs = [], []
    for salt in ("tenant-a", "tenant-b", "tenant-a", None, None, "tenant-b"):
        before = llm.engine.stats().prefix_cache_hits
        out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8,
                                                    ignore_eos=True, cache_salt=salt))[0]
        assert llm.engine.stats().prefix_cache_hits - before == out.num_cached_tokens
        cached.append(out.num_cached_tokens)
        outputs.append(out.outputs[0].token_ids)
    assert cached == [0, 0, full, 0, full, full]
    assert all(o == outputs[0] for o in outputs)
    with pytest.raises(ValueError, match="cache_salt"):
        llm.generate([prompt], SamplingParams(max_tokens=1, cache_salt=""))
    assert not llm.engine.has_unfinished_requests()


def test_priority_needs_the_priority_policy(base: LLM) -> None:
    with pytest.raises(ValueError, match="Got priority 1 but Priority scheduling is not enabled"):
        base.generate([[1, 2, 3]], SamplingParams(max_tokens=1, priority=1))
    assert not base.engine.has_unfinished_requests()


def test_priority_policy_admits_lower_values_first(loaded: Any) -> None:
    llm = make_llm(loaded, scheduling_policy="priority", max_num_seqs=1,
                   kv_cache_memory=32 * MiB, max_model_len=256)
    engine = llm.engine
    prompts = token_ids(llm, PROMPTS[:4])
    for i, (rid, priority) in enumerate((("p5", 5), ("p0", 0), ("m3", -3), ("p0-later", 0))):
        engine.add_request(rid, prompts[i], greedy(2), arrival_time=float(i),
                           priority=priority)
    first_token: list[str] = []
    while engine.has_unfinished_requests():
        for out in engine.step().outputs:
            if out.new_token_ids and out.request_id not in first_token:
                first_token.append(out.request_id)
    assert first_token == ["m3", "p0", "p0-later", "p5"]
