"""Sliding-window KV freed while sequences run (KV cache groups), on a tiny random Mistral
whose config gives its layers Gemma 3's pattern: two of every three layers slide a window of
8 positions, every third attends to everything.

Each engine here runs the same weights twice: with the hybrid KV manager (the sliding layers'
blocks the window has left are freed) and without it (every block kept). fp32 attention over
the same positions gives the same numbers whatever block ids hold them, so greedy tokens and
their logprobs must be identical, across long generations that cross the window many times,
preemption, n > 1, prefix-cache hits and chunked prefill."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from actors import LLM, SamplingParams
from actors.core.kv_groups import KVGroups, max_blocks_per_seq
from actors.core.runner.model_runner import kv_bytes_per_block

WINDOW, BS = 8, 4
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention"] * 2
VOCAB = 320


def add_tokenizer(model_dir: Path) -> None:
    """A word-level tokenizer of the tiny vocabulary ("t0" .. "t319"), enough to detokenize."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0",
                            eos_token="t1").save_pretrained(model_dir)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoModelForCausalLM, MistralConfig

    from actors.loader import load_model
    from conftest import TINY_SIZES, _randomize_

    cfg = MistralConfig(**{**TINY_SIZES, "num_hidden_layers": 6, "head_dim": 32,
                           "sliding_window": WINDOW, "layer_types": LAYER_TYPES,
                           "max_position_embeddings": 1024})
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    _randomize_(model, seed=77)
    out = tmp_path_factory.mktemp("sliding") / "mistral-gemma3-pattern"
    model.save_pretrained(out)
    add_tokenizer(out)
    return load_model(out, dtype="float32")


def make_llm(loaded: Any, hybrid: bool, **overrides: Any) -> LLM:
    args: dict[str, Any] = dict(dtype="float32", block_size=BS, max_model_len=512,
                                kv_cache_memory=4 << 20, max_num_batched_tokens=64,
                                disable_hybrid_kv_cache_manager=not hybrid)
    args.update(overrides)
    return LLM(str(loaded.source), loaded=loaded, **args)


def prompts(n: int, length: Callable[[int], int]) -> list[list[int]]:
    return [[(7 * i + 13 * j) % (VOCAB - 2) + 2 for j in range(length(i))] for i in range(n)]


def run(llm: LLM, ps: list[list[int]], params: SamplingParams) -> list[list[tuple]]:
    """Per prompt, per choice: (token, its logprob) pairs."""
    return [[tuple((t, lp.logprob) for t, lp in zip(c.token_ids, c.logprobs))
             for c in o.outputs] for o in llm.generate(ps, params)]


def twice(llm: LLM, ps: list[list[int]], params: SamplingParams) -> tuple:
    """Two runs of the same prompts on one engine (the second finds their prefixes cached:
    its prompts are computed in other chunks, so its logprobs may differ in the last ulp
    from the first's, with or without freeing alike), and the second's cached tokens."""
    first = run(llm, ps, params)
    outs = llm.generate(ps, params)
    second = [[tuple((t, lp.logprob) for t, lp in zip(c.token_ids, c.logprobs))
               for c in o.outputs] for o in outs]
    return first, second, [o.num_cached_tokens for o in outs]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)


def test_the_config_gives_three_groups_of_two_layers(loaded: Any) -> None:
    llm = make_llm(loaded, hybrid=True)
    groups = llm.engine.kv_groups
    assert groups == KVGroups((None, WINDOW, WINDOW), ((2, 5), (0, 1), (3, 4)), 2)
    assert llm.engine.kv.group_windows == (None, WINDOW, WINDOW)
    # A block is a page of two layers: three times the blocks of the same memory.
    kept = make_llm(loaded, hybrid=False)
    assert kept.engine.kv_groups == KVGroups.single(6)
    assert llm.engine.num_blocks == (4 << 20) // kv_bytes_per_block(2, 2, 32, BS, torch.float32)
    assert kept.engine.num_blocks == (4 << 20) // kv_bytes_per_block(6, 2, 32, BS, torch.float32)
    assert len(llm.engine.runner.k_caches) == 2 and len(kept.engine.runner.k_caches) == 6


def test_greedy_long_generation_is_identical_and_sliding_blocks_stay_bounded(
        loaded: Any) -> None:
    ps = prompts(3, lambda i: 30 + 17 * i)  # 30, 47, 64 tokens: prefill chunks of 64
    want = twice(make_llm(loaded, hybrid=False), ps, greedy(150))
    assert twice(make_llm(loaded, hybrid=True), ps, greedy(150)) == want
    assert min(want[2]) > 0  # the second run hit the prefix cache
    eng = make_llm(loaded, hybrid=True).engine
    for i, p in enumerate(ps):
        eng.add_request(f"r{i}", p, greedy(150))
    most = [0, 0, 0]
    decode_bound = -(-WINDOW // BS) + 2  # KVGroups.max_blocks_per_seq at a 1-token step
    while eng.has_unfinished():
        eng.step()
        for seq in eng.scheduler.running:
            held = eng.kv.held_blocks(seq)
            most = [max(m, h) for m, h in zip(most, held)]
            if seq.num_computed_tokens > seq.num_prompt_tokens:  # decoding
                assert held[1] <= decode_bound and held[2] <= decode_bound, (seq, held)
                assert held[0] == -(-seq.num_computed_tokens // BS)  # the full group: all
    assert most[0] >= 50
    assert max(most[1:]) <= -(-(WINDOW - 1 + 64) // BS) + 2  # a 64-token chunk's window
    assert eng.kv.stats().num_used == 0  # everything back


def test_preemption_under_freeing(loaded: Any) -> None:
    ps = prompts(4, lambda i: 12 + 9 * i)
    want = run(make_llm(loaded, hybrid=False), ps, greedy(120))
    # Room for one whole sequence of max_model_len and little more: four preempt each other.
    per_block = kv_bytes_per_block(2, 2, 32, BS, torch.float32)
    blocks = max_blocks_per_seq((None, WINDOW, WINDOW), 160, 64, BS) + 8
    tight = make_llm(loaded, hybrid=True, max_model_len=160, kv_cache_memory=blocks * per_block)
    assert tight.engine.num_blocks == blocks
    got = run(tight, ps, greedy(120))
    assert tight.engine.scheduler.num_preemptions > 0
    # A preempted sequence recomputes its tokens in other chunks than the first time: the
    # same tokens, logprobs equal up to the last few ulps.
    for g, w in zip(got, want):
        assert [t for t, _ in g[0]] == [t for t, _ in w[0]]
        assert max(abs(a - b) for (_, a), (_, b) in zip(g[0], w[0])) < 1e-4


def test_n_choices_and_prefix_hits_under_freeing(loaded: Any) -> None:
    # 48 tokens: the children recompute from 44, whose window starts at 37 (block 9) while
    # the parent's own, after its prompt, starts at 41 (block 10): it keeps block 9 for them.
    p = prompts(1, lambda i: 48)[0]
    seeded = SamplingParams(temperature=0.9, n=3, seed=11, max_tokens=60, ignore_eos=True,
                            logprobs=0)
    # The second run finds the prompt's prefix in every group (freed sliding blocks keep
    # their hash until the pool hands them out).
    want = twice(make_llm(loaded, hybrid=False), [p], seeded)
    got = twice(make_llm(loaded, hybrid=True), [p], seeded)
    assert got == want
    assert len(set(got[0][0])) == 3  # the choices differ: each ran on its own blocks
    assert got[2] == [44]  # 11 blocks of 4 cached; the prompt's last block is computed


def test_beam_search_under_freeing(loaded: Any) -> None:
    # Beams fork at every output position (mid-block), long past the window: a child
    # recomputes from its parent's last full block, whose window the parent keeps.
    ps = prompts(2, lambda i: 21 + 6 * i)
    beams = SamplingParams(n=3, use_beam_search=True, max_tokens=40, ignore_eos=True,
                           logprobs=0)
    want = run(make_llm(loaded, hybrid=False), ps, beams)
    got = run(make_llm(loaded, hybrid=True), ps, beams)
    assert got == want
    assert all(len(set(o)) == 3 for o in got)


def test_a_model_without_sliding_layers_keeps_one_group(make_tiny_model: Any) -> None:
    from actors.loader import load_model

    path = make_tiny_model("llama", head_dim=32)
    add_tokenizer(path)
    llm = LLM(str(path), loaded=load_model(path, dtype="float32"), dtype="float32",
              block_size=BS, max_model_len=256, kv_cache_memory=1 << 20)
    eng = llm.engine
    assert eng.kv_groups == KVGroups.single(3) and eng.kv.num_groups == 1
    assert eng.num_blocks == (1 << 20) // kv_bytes_per_block(3, 2, 32, BS, torch.float32)
    assert len(eng.runner.k_caches) == 3
    eng.add_request("a", prompts(1, lambda i: 30)[0], greedy(20))
    eng.step()
    seq = eng.scheduler.running[0]
    assert seq.group_block_ids == [] and len(seq.block_ids) == -(-30 // BS)


def test_a_head_size_the_attention_cannot_run_is_refused_at_load(make_tiny_model: Any) -> None:
    """Refused when the engine is built (the server exits 2 with that line), not by the first
    request's attention call."""
    from actors.loader import load_model
    from actors.models import UnsupportedModelError

    path = make_tiny_model("llama", head_dim=16)
    add_tokenizer(path)
    with pytest.raises(UnsupportedModelError, match="head size 16 is not supported"):
        LLM(str(path), loaded=load_model(path, dtype="float32"), dtype="float32",
            block_size=BS, max_model_len=256, kv_cache_memory=1 << 20)
