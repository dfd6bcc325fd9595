"""The compiled sampler against the torch reference (llmcore.ref_sampling)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import scipy.stats
import torch

from llmcore import NO_TOKEN, SamplingBatch, rng_uniform, sample
from llmcore.ref_sampling import RefRow, reference_row

VOCAB = 1000


def _call(logits: Any, rows: list[RefRow], seeds: Any = 7, positions: Any = 0,
          **kw: Any) -> tuple[np.ndarray, ...]:
    """Runs the compiled sampler through the builder for RefRow parameters."""
    batch = SamplingBatch()
    seeds = np.broadcast_to(np.asarray(seeds, np.uint64), (len(rows),))
    positions = np.broadcast_to(np.asarray(positions, np.int64), (len(rows),))
    for r, p in enumerate(rows):
        batch.add(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, min_p=p.min_p,
                  repetition_penalty=p.repetition_penalty, presence_penalty=p.presence_penalty,
                  frequency_penalty=p.frequency_penalty, seed=int(seeds[r]),
                  position=int(positions[r]), prompt_tokens=p.prompt_tokens,
                  output_tokens=p.output_tokens, logit_bias=p.logit_bias,
                  banned_tokens=p.banned_tokens, allowed_tokens=p.allowed_tokens)
    return tuple(batch.sample(logits, **kw))


def _defaults(n: int, **over: Any) -> dict[str, Any]:
    cols: dict[str, Any] = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                repetition_penalty=1.0, presence_penalty=0.0,
                                frequency_penalty=0.0, seed=1, position=0)
    cols.update(over)
    return {k: np.broadcast_to(np.asarray(v), (n,)).copy() for k, v in cols.items()}


def _draws(logits_row: torch.Tensor, p: RefRow, n: int, seed: int = 1234) -> np.ndarray:
    """n independent draws of one row: the row broadcast (stride 0), positions 0..n-1."""
    logits = logits_row.reshape(1, -1).expand(n, -1)

    def csr(tokens: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray] | None:
        if not tokens:
            return None
        return np.arange(n + 1, dtype=np.int32) * len(tokens), np.tile(
            np.asarray(tokens, np.int32), n)

    bias = csr(tuple(p.logit_bias))
    cols = _defaults(n, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                     min_p=p.min_p, repetition_penalty=p.repetition_penalty,
                     presence_penalty=p.presence_penalty,
                     frequency_penalty=p.frequency_penalty, seed=seed, position=np.arange(n))
    tokens = sample(
        logits, **cols, prompt_tokens=csr(p.prompt_tokens), output_tokens=csr(p.output_tokens),
        banned_tokens=csr(p.banned_tokens),
        logit_bias=None if bias is None else (
            *bias, np.tile(np.asarray(list(p.logit_bias.values()), np.float32), n)))[0]
    return tokens


def _chi2_pvalue(tokens: np.ndarray, probs: torch.Tensor) -> float:
    """Chi-square p-value of the drawn tokens against probs; rare tokens share bins."""
    probs_np = probs.numpy()
    counts = np.bincount(tokens, minlength=probs_np.size).astype(np.float64)
    assert counts[probs_np == 0].sum() == 0, "drew a token outside the support"
    expected = probs_np * tokens.size
    order = np.argsort(-expected, kind="stable")
    bins_obs, bins_exp, acc_o, acc_e = [], [], 0.0, 0.0
    for i in order:
        if expected[i] == 0:
            break
        acc_o += counts[i]
        acc_e += expected[i]
        if acc_e >= 20:
            bins_obs.append(acc_o)
            bins_exp.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0:
        bins_obs[-1] += acc_o
        bins_exp[-1] += acc_e
    if len(bins_obs) < 2:
        return 1.0
    obs, exp = np.asarray(bins_obs), np.asarray(bins_exp)
    exp *= obs.sum() / exp.sum()
    return float(scipy.stats.chisquare(obs, exp).pvalue)


@pytest.fixture
def logits() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(32, VOCAB, generator=gen) * 2.0


def test_greedy_is_argmax_with_raw_logprobs(logits: torch.Tensor) -> None:
    tokens, lps, ranks, top_t, top_l, _ = _call(logits, [RefRow(temperature=0.0)] * 32,
                                                num_top_logprobs=5)
    ref = torch.log_softmax(logits, -1)
    assert (tokens == logits.argmax(-1).numpy()).all()
    assert (ranks == 1).all()
    np.testing.assert_allclose(lps, ref.max(-1).values.numpy(), rtol=1e-5, atol=1e-5)
    best = torch.topk(ref, 5)
    assert (top_t == best.indices.numpy()).all()
    np.testing.assert_allclose(top_l, best.values.numpy(), rtol=1e-5, atol=1e-5)


def test_top_k_one_is_greedy(logits: torch.Tensor) -> None:
    tokens = _call(logits, [RefRow(temperature=1.3, top_k=1)] * 32, positions=np.arange(32))[0]
    assert (tokens == logits.argmax(-1).numpy()).all()


def test_greedy_ties_pick_lowest_id_and_top_n_orders_ties() -> None:
    x = torch.zeros(2, 64)
    x[0, [40, 9, 33]] = 3.0
    x[1, [5, 6]] = 1.0
    tokens, _, ranks, top_t, *_ = _call(x, [RefRow(temperature=0.0)] * 2, num_top_logprobs=4)
    assert tokens.tolist() == [9, 5]
    assert ranks.tolist() == [1, 1]
    assert top_t.tolist() == [[9, 33, 40, 0], [5, 6, 0, 1]]


def test_logprobs_ranks_top_n_of_sampled_tokens(logits: torch.Tensor) -> None:
    rows = [RefRow(temperature=1.0, top_p=0.95)] * 32
    tokens, lps, ranks, top_t, top_l, _ = _call(logits, rows, positions=np.arange(32),
                                                num_top_logprobs=20)
    ref = torch.log_softmax(logits, -1)
    for r in range(32):
        t = int(tokens[r])
        assert abs(lps[r] - float(ref[r, t])) < 1e-5
        assert ranks[r] == 1 + int((ref[r] > ref[r, t]).sum())
        best = torch.topk(ref[r], 20)
        assert top_t[r].tolist() == best.indices.tolist()
        np.testing.assert_allclose(top_l[r], best.values.numpy(), rtol=1e-5, atol=1e-5)


CRAFTED = [
    RefRow(temperature=0.0, logit_bias={3: 50.0, 7: -2.5}),
    RefRow(temperature=0.0, banned_tokens=tuple(range(0, VOCAB, 2))),
    RefRow(temperature=0.0, allowed_tokens=(5, 77, 901, 999)),
    RefRow(temperature=0.0, repetition_penalty=1.8, prompt_tokens=(1, 2, 3, 3, 500),
           output_tokens=(2, 600, 600)),
    RefRow(temperature=0.0, frequency_penalty=0.7, presence_penalty=0.4,
           output_tokens=(10, 10, 10, 11, 12, 12)),
    RefRow(temperature=0.6, repetition_penalty=0.7, frequency_penalty=-0.3,
           presence_penalty=1.5, prompt_tokens=tuple(range(50)),
           output_tokens=(1, 1, 60, 70, 70, 70), logit_bias={4: 1.0, 60: 3.0},
           banned_tokens=(8, 9), allowed_tokens=tuple(range(0, VOCAB, 3))),
]


@pytest.mark.parametrize("row", range(len(CRAFTED)))
def test_processing_matches_reference(logits: torch.Tensor, row: int) -> None:
    p = CRAFTED[row]
    x = logits[row : row + 1]
    ref = reference_row(x[0], p)
    tokens, lps, ranks, top_t, top_l, _ = _call(x, [p], num_top_logprobs=20,
                                                logprobs_mode="processed")
    t = int(tokens[0])
    if p.temperature <= 0:
        assert t == ref.greedy_token
    assert ref.probs[t] > 0
    assert abs(lps[0] - float(ref.processed_logprobs[t])) < 1e-4
    assert ranks[0] == 1 + int((ref.processed_logprobs > ref.processed_logprobs[t]).sum())
    finite = int(torch.isfinite(ref.processed_logprobs).sum())
    best = torch.topk(ref.processed_logprobs, min(20, finite))
    assert top_t[0, : best.indices.numel()].tolist() == best.indices.tolist()
    np.testing.assert_allclose(top_l[0, : best.values.numel()], best.values.numpy(), atol=1e-4)
    assert (top_t[0, best.indices.numel() :] == NO_TOKEN).all()


DISTRIBUTIONS = {
    "temperature": RefRow(temperature=0.7),
    "top_k": RefRow(temperature=1.0, top_k=6),
    "top_p": RefRow(temperature=1.0, top_p=0.8),
    "min_p": RefRow(temperature=1.2, min_p=0.08),
    "combined": RefRow(temperature=1.4, top_k=12, top_p=0.9, min_p=0.02,
                       repetition_penalty=1.3, output_tokens=(0, 1, 1),
                       logit_bias={20: 1.5}, banned_tokens=(2,)),
}


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_draws_follow_the_reference_distribution(name: str) -> None:
    p = DISTRIBUTIONS[name]
    gen = torch.Generator().manual_seed(1)
    row = torch.randn(40, generator=gen) * 1.5
    ref = reference_row(row, p)
    tokens = _draws(row, p, 20000)
    assert _chi2_pvalue(tokens, ref.probs) > 1e-3
    # The test has power: a slightly different distribution is rejected.
    wrong = reference_row(row, RefRow(**{**p.__dict__, "temperature": p.temperature * 1.15}))
    assert _chi2_pvalue(tokens[np.isin(tokens, np.nonzero(wrong.probs.numpy())[0])],
                        wrong.probs) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_vocab_top_p_without_top_k(dtype: torch.dtype) -> None:
    # Whole-vocabulary top-p takes the bucketed threshold search.
    gen = torch.Generator().manual_seed(2)
    row = (torch.randn(4096, generator=gen) * 1.2).to(dtype)
    p = RefRow(temperature=0.9, top_p=0.6)
    ref = reference_row(row, p)
    assert 50 < int((ref.probs > 0).sum()) < 4096
    tokens = _draws(row, p, 10000, seed=99)
    assert _chi2_pvalue(tokens, ref.probs) > 1e-3


def test_bf16_greedy_matches_float_argmax(logits: torch.Tensor) -> None:
    x = logits.to(torch.bfloat16)
    tokens, lps, *_ = _call(x, [RefRow(temperature=0.0)] * 32)
    xf = x.float()
    assert (tokens == xf.argmax(-1).numpy()).all()
    np.testing.assert_allclose(lps, torch.log_softmax(xf, -1).max(-1).values.numpy(),
                               atol=1e-5)


def test_row_stride_and_batch_invariance() -> None:
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(64, VOCAB + 24, generator=gen) * 3
    x = wide[:, :VOCAB]  # row stride VOCAB + 24
    cols = _defaults(64, temperature=np.linspace(0.3, 1.5, 64).astype(np.float32),
                     top_k=np.arange(64) % 4 * 20, top_p=np.where(np.arange(64) % 3, 0.9, 1.0),
                     min_p=np.where(np.arange(64) % 5 == 0, 0.05, 0.0),
                     seed=np.arange(64, dtype=np.uint64) * 1000, position=np.arange(64) + 5)
    tokens_batch = sample(x, **cols)[0]
    for r in (0, 17, 40, 63):
        one = {k: v[r : r + 1] for k, v in cols.items()}
        assert sample(x[r : r + 1].contiguous(), **one)[0][0] == tokens_batch[r]
    # Same again: deterministic.
    assert (sample(x, **cols)[0] == tokens_batch).all()
    # Another seed changes the draws.
    assert (sample(x, **{**cols, "seed": cols["seed"] + 1})[0] != tokens_batch).any()


def test_draw_is_the_documented_exponential_race() -> None:
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(16, 300, generator=gen)
    cols = _defaults(16, temperature=0.8, seed=77, position=np.arange(16) * 7)
    tokens = sample(x, **cols)[0]
    for r in range(16):
        s = (x[r] / np.float32(0.8)).double().numpy()
        u = rng_uniform(77, r * 7, np.arange(300)).astype(np.float64)
        with np.errstate(divide="ignore"):
            key = np.exp(s - s.max()) / -np.log(u)
        assert tokens[r] == int(np.argmax(key))


def test_rng_is_philox4x32_10() -> None:
    def philox(ctr: list[int], key: list[int]) -> list[int]:
        m = 0xFFFFFFFF
        for rnd in range(10):
            if rnd:
                key = [(key[0] + 0x9E3779B9) & m, (key[1] + 0xBB67AE85) & m]
            p0, p1 = 0xD2511F53 * ctr[0], 0xCD9E8D57 * ctr[2]
            ctr = [(p1 >> 32) ^ ctr[1] ^ key[0], p1 & m, (p0 >> 32) ^ ctr[3] ^ key[1], p0 & m]
        return ctr

    seed, position = 0xDEADBEEF12345678, 2**33 + 5
    got = rng_uniform(seed, position, np.arange(12))
    for i in range(12):
        out = philox([i >> 2, position & 0xFFFFFFFF, position >> 32, 0],
                     [seed & 0xFFFFFFFF, seed >> 32])
        assert got[i] == np.float32((out[i & 3] >> 8) * 2.0**-24)


def test_all_masked_rows_yield_no_token() -> None:
    x = torch.randn(3, 100)
    x[2] = float("nan")
    cols = _defaults(3, temperature=np.array([0.0, 1.0, 1.0], np.float32))
    banned = (np.array([0, 100, 100, 100], np.int32), np.tile(np.arange(100, dtype=np.int32), 1))
    mask = np.zeros((3, 4), np.int32)
    tokens, lps, ranks, top_t, top_l, _ = sample(
        x, **cols, banned_tokens=banned, allowed_bitmask=mask, use_bitmask=np.array([0, 1, 0]),
        num_top_logprobs=3, logprobs_mode="processed")
    assert tokens.tolist() == [NO_TOKEN] * 3
    assert np.isneginf(lps).all() and (ranks == 0).all()
    assert (top_t == NO_TOKEN).all() and np.isneginf(top_l).all()


def test_nan_and_inf_logits_never_propagate() -> None:
    x = torch.randn(2, 50)
    x[0, 3] = float("nan")
    x[0, 7] = float("inf")
    x[1, :10] = float("-inf")
    tokens, lps, *_ = sample(x, **_defaults(2, temperature=0.5), num_top_logprobs=2)
    assert tokens[0] == 7 and tokens[1] >= 10
    assert not np.isnan(lps).any()


def _bad_calls() -> list[tuple[str, dict[str, Any]]]:
    return [
        ("top_p", {"top_p": 0.0}),
        ("top_p", {"top_p": 1.5}),
        ("min_p", {"min_p": -0.1}),
        ("repetition_penalty", {"repetition_penalty": 0.0}),
        ("temperature", {"temperature": float("nan")}),
        ("presence_penalty", {"presence_penalty": float("inf")}),
        ("outside", {"output_tokens": (np.array([0, 1, 1]), np.array([10], np.int32))}),
        ("non-decreasing", {"banned_tokens": (np.array([0, 1, 0]), np.array([1], np.int32))}),
        ("too small", {"allowed_bitmask": np.zeros((2, 0), np.int32)}),
        ("num_top_logprobs", {"num_top_logprobs": 21}),
        ("logprobs_mode", {"logprobs_mode": "softmax"}),
        ("rows", {"seed": np.zeros(3, np.uint64)}),
        ("finite", {"logit_bias": (np.array([0, 1, 1]), np.array([2], np.int32),
                                   np.array([np.inf], np.float32))}),
    ]


@pytest.mark.parametrize("case", range(len(_bad_calls())))
def test_invalid_arguments_raise_value_error(case: int) -> None:
    words, over = _bad_calls()[case]
    cols = _defaults(2)
    extra = {k: over.pop(k) for k in list(over) if k not in cols}
    cols.update({k: np.asarray(v) for k, v in over.items()})
    with pytest.raises(ValueError, match=words):
        sample(torch.zeros(2, 10), **cols, **extra)


def test_empty_batch() -> None:
    tokens, lps, ranks, top_t, top_l, listed = sample(torch.zeros(0, 10), **_defaults(0),
                                                      num_top_logprobs=2)
    assert tokens.shape == (0,) and top_t.shape == (0, 2) and listed.shape == (0,)


def test_float16_logits_are_rejected() -> None:
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        sample(torch.zeros(1, 10, dtype=torch.float16), **_defaults(1))


def test_builder_bitmask_and_bias() -> None:
    batch = SamplingBatch()
    batch.add(temperature=0.0, allowed_tokens=[40, 41])
    batch.add(temperature=0.0, logit_bias={5: 100.0})
    batch.add(temperature=0.0)
    x = torch.zeros(3, 64)
    x[:, 41] = 1.0
    x[:, 63] = 2.0
    result = batch.sample(x)
    assert result.tokens.tolist() == [41, 5, 63]
    args = batch.arrays(64)
    assert args["use_bitmask"].tolist() == [1, 0, 0]
    assert args["allowed_bitmask"].shape == (3, 2)


def test_top_logprobs_up_to_the_vocabulary(logits: torch.Tensor) -> None:
    """Any count up to the vocabulary (vLLM's max_logprobs=-1), best first; beyond it refused."""
    rows = [RefRow(temperature=0.0)] * 2
    _, _, _, top_t, top_l, _ = _call(logits[:2], rows, num_top_logprobs=VOCAB)
    want = torch.log_softmax(logits[:2].double(), dim=-1)
    for r in range(2):
        order = torch.sort(want[r], descending=True, stable=True)
        assert top_t[r].tolist() == order.indices.tolist()
        np.testing.assert_allclose(top_l[r], order.values.numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="num_top_logprobs"):
        _call(logits[:2], rows, num_top_logprobs=VOCAB + 1)
