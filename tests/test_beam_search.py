"""Beam search in the engine against searches written plainly over transformers' logprobs.

A tiny random Llama (EOS = token 1) is served by the offline LLM; the references run the
same model in transformers, one full forward per hypothesis:

- ``reference_beams``: vLLM's algorithm (vllm/entrypoints/generate/beam_search/online.py)
  written naively: each beam's top 2 * width tokens, EOS ones finished at once, the best
  width others kept, the answer sorted by cum_logprob / generated ** length_penalty;
- ``exhaustive``: every sequence up to max_tokens (EOS ends one), scored the same way. With
  a vocabulary of V tokens, width >= V ** (max_tokens - 1) and 2 * width >= V the beam
  search prunes nothing that could win, so its answer is the exhaustive one.

Both are checked under the engine's own pressures too: tiny blocks (forks in the middle of
a block), a KV cache small enough to preempt beams, chunked prefill, and ordinary requests
in the same batch.
"""

from __future__ import annotations

import math
from itertools import product
from pathlib import Path
from typing import Any

import pytest
import torch

from actors import LLM, SamplingParams

EOS = 1


def add_tokenizer(model_dir: Path, vocab: int) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0",
                            eos_token=f"t{EOS}").save_pretrained(model_dir)


def tiny(tmp: Path, vocab: int, seed: int) -> tuple[Any, Any]:
    """(LoadedModel, the transformers model) of a random tiny Llama with this vocabulary."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from actors.loader import load_model
    from conftest import TINY_SIZES, _randomize_

    cfg = LlamaConfig(**{**TINY_SIZES, "head_dim": 32, "vocab_size": vocab, "eos_token_id": EOS,
                         "bos_token_id": 0})
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    _randomize_(model, seed=seed)
    model.eval()
    out = tmp / f"llama-v{vocab}"
    model.save_pretrained(out)
    add_tokenizer(out, vocab)
    return load_model(out, dtype="float32"), model


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    return tiny(tmp_path_factory.mktemp("beam"), 320, seed=5)


@pytest.fixture(scope="module")
def narrow(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    return tiny(tmp_path_factory.mktemp("beam"), 6, seed=9)


def make_llm(loaded: Any, **overrides: Any) -> LLM:
    args: dict[str, Any] = dict(dtype="float32", block_size=16, max_model_len=256,
                                kv_cache_memory=8 << 20)
    args.update(overrides)
    return LLM(str(loaded.source), loaded=loaded, **args)


class Scorer:
    """Next-token logprobs of a prefix under the transformers model (memoised)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.cache: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, ids: tuple[int, ...]) -> torch.Tensor:
        if ids not in self.cache:
            with torch.inference_mode():
                logits = self.model(torch.tensor([ids])).logits[0, -1]
            self.cache[ids] = torch.log_softmax(logits.double(), -1)
        return self.cache[ids]


def score(cum: float, generated: int, length_penalty: float) -> float:
    return cum / max(generated, 1) ** length_penalty


def reference_beams(scorer: Scorer, prompt: list[int], width: int, max_tokens: int,
                    length_penalty: float = 1.0, ignore_eos: bool = False,
                    include_stop: bool = False) -> list[tuple[list[int], float, str]]:
    """[(token ids, cum logprob, finish reason)] best first, as vLLM's search."""
    beams: list[tuple[list[int], float]] = [([], 0.0)]
    done: list[tuple[list[int], float, int, str]] = []  # (tokens, cum, generated, reason)
    for _ in range(max_tokens):
        cands = []
        for tokens, cum in beams:
            lps = scorer(tuple(prompt + tokens))
            top = torch.topk(lps, min(2 * width, len(lps)))
            for lp, tok in zip(top.values.tolist(), top.indices.tolist()):
                if tok == EOS and not ignore_eos:
                    out = tokens + [tok] if include_stop else tokens
                    done.append((out, cum + lp, len(tokens) + 1, "stop"))
                else:
                    cands.append((cum + lp, tokens + [tok]))
        cands.sort(key=lambda c: -c[0])
        beams = [(t, c) for c, t in cands[:width]]
        if not beams:
            break
    done += [(t, c, len(t), "length") for t, c in beams]
    done.sort(key=lambda d: -score(d[1], d[2], length_penalty))
    return [(t, c, r) for t, c, _, r in done[:width]]


def exhaustive(scorer: Scorer, prompt: list[int], vocab: int, width: int, max_tokens: int,
               length_penalty: float) -> list[tuple[list[int], float, str]]:
    """Every output up to max_tokens (EOS ends one), best width first."""
    found = []
    for n in range(1, max_tokens + 1):
        for seq in product(range(vocab), repeat=n):
            if EOS in seq[:-1]:
                continue
            cum = sum(float(scorer(tuple(prompt) + seq[:i])[seq[i]]) for i in range(n))
            if seq[-1] == EOS:
                found.append((list(seq[:-1]), cum, n, "stop"))
            elif n == max_tokens:
                found.append((list(seq), cum, n, "length"))
    found.sort(key=lambda d: -score(d[1], d[2], length_penalty))
    return [(t, c, r) for t, c, _, r in found[:width]]


def beam(llm: LLM, prompts: list[list[int]], width: int, max_tokens: int, **kw: Any) -> list:
    params = SamplingParams(n=width, use_beam_search=True, max_tokens=max_tokens, **kw)
    return llm.generate(prompts, params)


def assert_same(got: Any, want: list[tuple[list[int], float, str]]) -> None:
    assert [(list(c.token_ids), c.finish_reason) for c in got.outputs] == \
        [(t, r) for t, _, r in want]


PROMPTS = [[5, 17, 42, 9, 77, 3], [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110,
                                   111, 112, 113, 114, 115, 116, 117, 118, 2, 3]]


@pytest.mark.parametrize("width", [1, 2, 3])
@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0])
def test_beams_equal_the_reference_search(wide: tuple[Any, Any], width: int,
                                          length_penalty: float) -> None:
    loaded, model = wide
    scorer = Scorer(model)
    llm = make_llm(loaded)
    outs = beam(llm, PROMPTS, width, 8, length_penalty=length_penalty)
    for prompt, got in zip(PROMPTS, outs):
        want = reference_beams(scorer, prompt, width, 8, length_penalty)
        assert len(got.outputs) == width
        assert_same(got, want)


@pytest.mark.parametrize("width", [1, 3])
def test_eos_inclusion_and_ignore_eos(wide: tuple[Any, Any], width: int) -> None:
    loaded, model = wide
    scorer = Scorer(model)
    llm = make_llm(loaded)
    for kw in (dict(include_stop_str_in_output=True), dict(ignore_eos=True)):
        outs = beam(llm, PROMPTS, width, 6, **kw)
        for prompt, got in zip(PROMPTS, outs):
            assert_same(got, reference_beams(
                scorer, prompt, width, 6, ignore_eos=kw.get("ignore_eos", False),
                include_stop=kw.get("include_stop_str_in_output", False)))


@pytest.mark.parametrize("length_penalty", [1.0, 0.5])
def test_wide_enough_beams_are_the_exhaustive_search(narrow: tuple[Any, Any],
                                                     length_penalty: float) -> None:
    loaded, model = narrow
    scorer = Scorer(model)
    llm = make_llm(loaded)
    vocab, max_tokens, width = 6, 2, 6  # width >= V ** (max_tokens - 1), 2 * width >= V
    prompt = [2, 3, 4, 5, 2]
    got = beam(llm, [prompt], width, max_tokens, length_penalty=length_penalty)[0]
    want = exhaustive(scorer, prompt, vocab, width, max_tokens, length_penalty)
    assert_same(got, want)
    assert want == reference_beams(scorer, prompt, width, max_tokens, length_penalty)


def test_beams_under_small_blocks_preemption_chunks_and_other_requests(
        wide: tuple[Any, Any]) -> None:
    """Blocks of 4 (every step forks mid-block), a cache of 16 blocks shared with ordinary
    requests (beams are preempted and recomputed), 8-token chunks: the same answers."""
    loaded, model = wide
    scorer = Scorer(model)
    # K and V of 3 layers x 4 heads x 32 dims x 4 tokens in fp32: 6144 bytes a block
    llm = make_llm(loaded, block_size=4, kv_cache_memory=16 * 6144, max_num_batched_tokens=8,
                   max_model_len=64)
    assert llm.engine.num_blocks == 16
    width, max_tokens = 3, 10
    sampled = SamplingParams(temperature=1.0, seed=3, max_tokens=30, ignore_eos=True)
    params = [SamplingParams(n=width, use_beam_search=True, max_tokens=max_tokens)] * 2
    others = [[7, 8, 9], [10, 11, 12, 13], [20, 21], [30, 31, 32]]
    outs = llm.generate([*PROMPTS, *others], params + [sampled] * len(others))
    for prompt, got in zip(PROMPTS, outs[:2]):
        assert_same(got, reference_beams(scorer, prompt, width, max_tokens))
    assert all(len(o.outputs[0].token_ids) == 30 for o in outs[2:])
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.kv.pool.num_free() == llm.engine.num_blocks


def test_logprobs_of_beams(wide: tuple[Any, Any]) -> None:
    loaded, model = wide
    scorer = Scorer(model)
    llm = make_llm(loaded)
    prompt = PROMPTS[0]
    got = beam(llm, [prompt], 2, 5, logprobs=3, ignore_eos=True)[0]
    for choice in got.outputs:
        assert len(choice.logprobs) == len(choice.token_ids)
        for i, (tok, lp) in enumerate(zip(choice.token_ids, choice.logprobs)):
            ref = scorer(tuple(prompt + list(choice.token_ids[:i])))
            assert math.isclose(lp.logprob, float(ref[tok]), abs_tol=1e-4)
            assert list(lp.top_token_ids) == torch.topk(ref, 3).indices.tolist()
