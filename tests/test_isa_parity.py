"""Every CPU kernel variant this machine runs against the scalar one, on the engine's shapes.

The attention and sampling kernels are compiled for scalar, AVX2 and AVX-512 and chosen at run
time. Each SIMD variant is compared here with the scalar variant on identical inputs, in one
process (``llmcore.isa.capped``): kernel calls on the default model's geometry, then greedy
generation on the engine tests' prompts. A variant the CPU lacks is skipped with the reason;
the session summary lists which variants ran (conftest's ISA report).

Tolerances, and why:
- attention, fp32 output: the variants differ only in summation order and in exp (a ~1 ulp
  polynomial against libm), so outputs (averages of values ~N(0, 1)) agree within 2e-6
  (measured: 6e-7 at most, AVX2 and AVX-512, every geometry and dtype mix below);
- attention with a logit softcap of 50 (Gemma 2), fp32 output: cap * tanh(x / cap) is formed
  from exp as 1 - 2 / (e^2y + 1), exact to about an ulp of 1 whatever y, so a capped logit
  carries ~cap ulps of 1 (6e-6 at cap 50) and the exp variants' ulp differences reach the
  outputs amplified: within 2e-5 (measured: 1.1e-5 at most, head size 256);
- attention, bf16 output: the fp32 results agree as above, so the bf16 roundings agree except
  where a value sits on a rounding boundary: at most one bf16 ulp (plus 2e-6 near zero), on
  under 0.5% of elements (measured: up to 0.05%);
- sampling: the same arithmetic lane for lane (FMA contraction aside), but the softmax
  normaliser is a float32 sum of ~49k exps in 4, 8 or 16 lanes, whose rounding differs with
  the lane count: tokens, ranks and top-20 ids identical, logprobs within 5e-5 (measured:
  1.7e-5 at most);
- greedy generation: with an fp32 KV cache, identical tokens (a divergence is allowed only
  where the scalar run's two best logprobs are within 1e-3, and none is expected); with a bf16
  KV cache, a last-ulp difference in a cached value flips its bf16 rounding, which moves the
  logprobs by ~1e-2 after 30 layers (measured: up to 0.012 between any two variants on these
  prompts), so a divergence is allowed only at a near-tie: the scalar run's two best
  logprobs within 0.05 of each other. The test names every such position it meets.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from typing import Any

import llmcore
import numpy as np
import pytest
import torch
from llmcore import SamplingBatch
from subproc import child_env
from test_attention import Batch

SIMD = ["avx2", "avx512"]


def isa_or_skip(isa: str, record: Any, families: tuple[str, ...]) -> None:
    """Skips (with the reason) when this CPU or build does not run ``isa``."""
    cpu = llmcore.cpu_isa()
    if llmcore.isa.ISAS.index(isa) > llmcore.isa.ISAS.index(cpu):
        for f in families:
            record.skipped(f, isa, f"this CPU runs {cpu} at most")
        pytest.skip(f"{isa} kernels not run: this CPU runs {cpu} at most")


def run_attention(batch: Batch, out_dtype: torch.dtype, q_dtype: torch.dtype,
                  threads: int, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    q = batch.q.to(q_dtype)
    out = torch.full(q.shape, float("nan"), dtype=out_dtype)
    saved = llmcore.get_num_threads()
    try:
        llmcore.set_num_threads(threads)
        llmcore.paged_attention(batch.plan(), q, batch.k_cache, batch.v_cache, out, batch.scale,
                                window, softcap)
    finally:
        llmcore.set_num_threads(saved)
    return out


def poison_unused_blocks(batch: Batch) -> None:
    """NaN in every block no sequence owns: a read outside the block tables shows as NaN."""
    used = set(int(b) for b in batch.block_tables.ravel() if b >= 0)
    for b in range(batch.k_cache.shape[0]):
        if b not in used:
            batch.k_cache[b] = float("nan")
            batch.v_cache[b] = float("nan")


# The default model's attention: 9 query heads over 3 KV heads, head size 64, block size 16.
# (q_lens, seq_lens) of the steps the engine runs: batched decode, decode at long contexts (the
# context split across threads and merged), whole prompts, a prompt chunk after a cached
# prefix, chunked prefill beside decodes.
GEOMETRY = {
    "decode": ([1] * 24, [200 + 5 * i for i in range(24)]),
    "decode_long": ([1, 1], [3000, 2100]),
    "prefill": ([70, 45, 64, 3], [70, 45, 64, 3]),
    "prefill_after_prefix": ([150], [1650]),
    "mixed": ([70, 1, 1, 33, *[1] * 10], [70, 210, 64, 33, *range(20, 300, 31)]),
}
# (q dtype, KV cache dtype, output dtype): fp32 model; fp32 model with a bf16 cache; bf16 model.
DTYPES = {
    "fp32": (torch.float32, torch.float32, torch.float32),
    "fp32_bf16kv": (torch.float32, torch.bfloat16, torch.float32),
    "bf16": (torch.bfloat16, torch.bfloat16, torch.bfloat16),
}


def assert_attention_close(got: torch.Tensor, want: torch.Tensor, what: str,
                           fp32_tol: float = 2e-6) -> None:
    assert torch.isfinite(got).all(), f"{what}: non-finite output (a read outside the tables?)"
    g, w = got.double(), want.double()
    if got.dtype == torch.float32:
        err = (g - w).abs().max().item()
        assert err <= fp32_tol, f"{what}: max abs difference {err:.3g} > {fp32_tol}"
        return
    # One bf16 ulp is at most 2^-7 of the value; near zero the fp32 tolerance dominates.
    diff = (g - w).abs()
    bound = w.abs() * 2.0**-7 + 2e-6
    assert bool((diff <= bound).all()), f"{what}: a difference above one bf16 ulp"
    frac = (diff > 0).double().mean().item()
    assert frac < 0.005, f"{what}: {frac:.2%} of bf16 outputs differ (> 0.5%)"


@pytest.mark.parametrize("isa", SIMD)
@pytest.mark.parametrize("dtypes", sorted(DTYPES))
@pytest.mark.parametrize("step", sorted(GEOMETRY))
def test_attention_variant_matches_scalar(isa: str, dtypes: str, step: str,
                                          isa_record: Any) -> None:
    isa_or_skip(isa, isa_record, ("attention",))
    q_dtype, kv_dtype, out_dtype = DTYPES[dtypes]
    q_lens, seq_lens = GEOMETRY[step]
    batch = Batch(q_lens, seq_lens, 3, 3, 64, 16, kv_dtype, seed=len(step), spare_blocks=5)
    poison_unused_blocks(batch)
    with llmcore.isa.capped("scalar", ("attention",)):
        want = run_attention(batch, out_dtype, q_dtype, threads=1)
    if dtypes == "fp32":  # the scalar variant itself against the float64 reference
        assert (want.double() - batch.reference()).abs().max().item() <= 1e-5
    with llmcore.isa.capped(isa, ("attention",)) as got_isa:
        assert got_isa["attention"] == isa
        for threads in (1, 2):
            got = run_attention(batch, out_dtype, q_dtype, threads)
            assert_attention_close(got, want, f"{isa} {dtypes} {step} threads={threads}")
    isa_record.ran("attention", isa)


# Gemma 3 270M's attention: 4 query heads over one KV head of 256; five of six layers slide a
# window of 512 (both kinds here), and Gemma 2's logit softcap of 50 on top.
GEMMA3_GEOMETRY = {
    "decode": ([1] * 10, [1, 17, 300, 511, 512, 513, 700, 1024, 1500, 90]),
    "prefill": ([70, 45], [70, 45]),
    "chunk_after_prefix": ([64], [900]),
}


@pytest.mark.parametrize("isa", SIMD)
@pytest.mark.parametrize("dtypes", sorted(DTYPES))
@pytest.mark.parametrize("step", sorted(GEMMA3_GEOMETRY))
@pytest.mark.parametrize(("window", "softcap"), [(0, 0.0), (512, 0.0), (512, 50.0)])
def test_head_256_variant_matches_scalar(isa: str, dtypes: str, step: str, window: int,
                                         softcap: float, isa_record: Any) -> None:
    isa_or_skip(isa, isa_record, ("attention",))
    q_dtype, kv_dtype, out_dtype = DTYPES[dtypes]
    q_lens, seq_lens = GEMMA3_GEOMETRY[step]
    batch = Batch(q_lens, seq_lens, 1, 4, 256, 16, kv_dtype, seed=len(step), spare_blocks=5)
    poison_unused_blocks(batch)
    with llmcore.isa.capped("scalar", ("attention",)):
        want = run_attention(batch, out_dtype, q_dtype, 1, window, softcap)
    if dtypes == "fp32":
        ref = batch.reference(window, softcap)
        assert (want.double() - ref).abs().max().item() <= 1e-5
    with llmcore.isa.capped(isa, ("attention",)) as got_isa:
        assert got_isa["attention"] == isa
        for threads in (1, 2):
            got = run_attention(batch, out_dtype, q_dtype, threads, window, softcap)
            assert_attention_close(got, want, f"{isa} {dtypes} {step} d256 threads={threads}",
                                   2e-5 if softcap else 2e-6)
    isa_record.ran("attention", isa)


VOCAB = 49152  # the default model's vocabulary


def sample_all(logits: torch.Tensor, **kw: Any) -> tuple[np.ndarray, ...]:
    """Greedy rows, then seeded rows with every filter, each with its top-20 logprobs."""
    rows = logits.shape[0]
    batch = SamplingBatch()
    for r in range(rows):
        kind = r % 4
        batch.add(temperature=0.0 if kind == 0 else 0.7 + 0.1 * kind,
                  top_k=0 if kind < 2 else 50, top_p=1.0 if kind < 3 else 0.9,
                  min_p=0.05 if kind == 1 else 0.0,
                  repetition_penalty=1.0 if kind < 2 else 1.2,
                  presence_penalty=0.0 if kind < 3 else 0.5,
                  frequency_penalty=0.0, seed=1000 + r, position=r,
                  output_tokens=(1, 2, 3, r) if kind >= 2 else ())
    return tuple(batch.sample(logits, num_top_logprobs=20, **kw))


@pytest.mark.parametrize("isa", SIMD)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_sampling_variant_matches_scalar(isa: str, dtype: torch.dtype, mode: str,
                                         isa_record: Any) -> None:
    isa_or_skip(isa, isa_record, ("sampling",))
    gen = torch.Generator().manual_seed(5)
    # Model-like logits: a heavy head over a flat tail, some masked (-inf) and tied entries,
    # and a vocabulary that is no multiple of any vector width plus one.
    logits = (torch.randn(64, VOCAB + 7, generator=gen) * 3.0).to(dtype)
    logits[:, 100:110] = float("-inf")
    logits[::5, 7] = logits[::5, 8]
    with llmcore.isa.capped("scalar", ("sampling",)):
        want = sample_all(logits, logprobs_mode=mode)
    with llmcore.isa.capped(isa, ("sampling",)) as got_isa:
        assert got_isa["sampling"] == isa
        got = sample_all(logits, logprobs_mode=mode)
    tokens, lps, ranks, top_t, top_l, listed = got  # listed ids: tests/test_sampling_listed.py
    np.testing.assert_array_equal(tokens, want[0])
    np.testing.assert_allclose(lps, want[1], rtol=0, atol=5e-5)
    np.testing.assert_array_equal(ranks, want[2])
    np.testing.assert_array_equal(top_t, want[3])
    np.testing.assert_allclose(top_l, want[4], rtol=0, atol=5e-5)
    np.testing.assert_allclose(listed, want[5], rtol=0, atol=5e-5)
    isa_record.ran("sampling", isa)


# ---- greedy generation on the default model, every variant ----------------------------------

MiB = 1 << 20
NEAR_TIE = {"float32": 1e-3, "bfloat16": 0.05}


@pytest.fixture(scope="module")
def engines(default_model: tuple[Any, float]) -> dict[str, Any]:
    from actors import LLM

    loaded = default_model[0]
    return {kv: LLM(str(loaded.source), loaded=loaded, dtype="float32",
                    kv_cache_memory=128 * MiB, max_model_len=2048, kv_cache_dtype=kv)
            for kv in NEAR_TIE}


def greedy_runs(llm: Any) -> list[tuple[list[int], list[float]]]:
    """Per prompt: the 16 greedy tokens and, at each, the gap between the two best logprobs."""
    from actors import SamplingParams
    from test_engine import PROMPTS, SYSTEM

    prompts = [llm.tokenizer.encode(t, add_special_tokens=False)
               for t in PROMPTS + [SYSTEM + " " + p for p in PROMPTS]]
    params = SamplingParams(temperature=0.0, max_tokens=16, logprobs=2, ignore_eos=True)
    runs = []
    for out in llm.generate(prompts, params):
        o = out.outputs[0]
        gaps = [lp.top_logprobs[0] - lp.top_logprobs[1] for lp in o.logprobs]
        runs.append((list(o.token_ids), gaps))
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("isa", SIMD)
@pytest.mark.parametrize("kv", sorted(NEAR_TIE))
def test_greedy_generation_matches_scalar(isa: str, kv: str, engines: dict[str, Any],
                                          isa_record: Any) -> None:
    isa_or_skip(isa, isa_record, ("attention", "sampling"))
    llm = engines[kv]
    with llmcore.isa.capped("scalar", ("attention", "sampling")):
        want = greedy_runs(llm)
    with llmcore.isa.capped(isa, ("attention", "sampling")) as got_isa:
        assert got_isa == {"attention": isa, "sampling": isa}
        got = greedy_runs(llm)
    ties = []
    for p, ((w_tokens, w_gaps), (g_tokens, _)) in enumerate(zip(want, got)):
        first = next((i for i, (a, b) in enumerate(zip(w_tokens, g_tokens)) if a != b), None)
        if first is None:
            continue
        assert w_gaps[first] < NEAR_TIE[kv], (
            f"prompt {p}: {isa} and scalar diverge at token {first} where the scalar run's "
            f"two best logprobs are {w_gaps[first]:.4f} apart (no near-tie)")
        ties.append(f"prompt {p} token {first} (gap {w_gaps[first]:.4f})")
    if ties:
        print(f"{isa}, {kv} KV cache: diverged from scalar only at near-ties: {'; '.join(ties)}")
    isa_record.ran("attention", isa)
    isa_record.ran("sampling", isa)


def test_environment_caps_the_variant_at_import() -> None:
    """LLMCORE_ISA / LLMCORE_SAMPLING_ISA cap the variants in a fresh process."""
    code = "import json, llmcore; print(json.dumps(llmcore.isa.current()))"
    for cap in ("scalar", "avx2"):
        env = child_env(LLMCORE_ISA=cap, LLMCORE_SAMPLING_ISA=cap)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout
        got = json.loads(out)
        want = cap if llmcore.isa.ISAS.index(cap) <= llmcore.isa.ISAS.index(
            llmcore.cpu_isa()) else llmcore.cpu_isa()
        assert got["attention"] == want and got["sampling"] == want, got


def test_build_features_name_the_variants_built() -> None:
    features = llmcore.build_features().split(",")
    assert features[:2] == ["cpu", "scalar"]
    if platform.machine() in ("x86_64", "AMD64"):
        assert {"avx2", "avx512"} <= set(features)
    assert llmcore.cpu_isa() in llmcore.isa.ISAS
    with pytest.raises(ValueError, match="unknown instruction set"):
        llmcore.isa.set_isa("attention", "sse4")
    with pytest.raises(ValueError, match="unknown kernel family"):
        llmcore.isa.set_isa("convolution", "avx2")


# ---- linear: packed bf16 weights, every variant ----------------------------------------------

# The default model's projections (N, K), cut in N where it is large, plus a shape with a
# partial last panel, an odd panel count and an odd K.
LINEAR_SHAPES = {"qkv": (960, 576), "gate_up": (1536, 576), "down": (576, 1536),
                 "ragged": (40, 33)}


def linear_case(n: int, k: int, m: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) * 0.05).to(torch.bfloat16)
    x = torch.randn(m, k, generator=gen)
    bias = torch.randn(n, generator=gen)
    return w, x, bias


@pytest.mark.parametrize("isa", [*SIMD, "amx"])
@pytest.mark.parametrize("shape", sorted(LINEAR_SHAPES))
@pytest.mark.parametrize("m", [1, 16, 37, 200])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_variant_matches_reference(isa: str, shape: str, m: int,
                                                 out_dtype: torch.dtype,
                                                 isa_record: Any) -> None:
    """Against float64 on the inputs each variant computes from: fp32 activations (scalar,
    AVX2), activations rounded to bf16 (AVX512_BF16 and the AMX tiles, at every M). Either way only fp32
    accumulation remains: within 1e-5 of sum |x| |w|."""
    with llmcore.isa.capped(isa, ("linear",)) as got_isa:
        if got_isa["linear"] != isa:
            why = ("this CPU lacks AVX512_BF16" if isa == "avx512"
                   else "this CPU (or process) cannot use the AMX tiles" if isa == "amx"
                   else f"this CPU runs {llmcore.cpu_isa()} at most")
            isa_record.skipped("linear", isa, why)
            pytest.skip(f"linear {isa} not run: {why}")
        n, k = LINEAR_SHAPES[shape]
        w, x, bias = linear_case(n, k, m, seed=n + k + m)
        packed = llmcore.PackedWeight(w)
        out = torch.empty(m, n, dtype=out_dtype)
        llmcore.linear(x, packed, bias, out)
    xin = x.to(torch.bfloat16).double() if isa in ("avx512", "amx") else x.double()
    want = xin @ w.double().T + bias.double()
    scale = xin.abs() @ w.double().abs().T + bias.double().abs()
    tol = 1e-5 * scale + 1e-6
    if out_dtype == torch.bfloat16:
        tol = tol + want.abs() * 2.0**-8  # the output's own rounding (half an ulp)
    err = (out.double() - want).abs()
    assert bool((err <= tol).all()), f"max error {err.max().item():.3g}"
    # And within bf16 activation rounding of the exact fp32 product.
    exact = x.double() @ w.double().T + bias.double()
    assert (out.double() - exact).abs().max().item() <= (2.0**-8 * scale).max().item() + 1e-2
    isa_record.ran("linear", isa)


def test_bf16_linear_is_batch_invariant() -> None:
    """With AVX512_BF16 a row's result does not depend on the rows beside it, to the bit.
    (The AVX2 kernel splits the accumulation differently below 3 rows: last-bit
    differences.)"""
    with llmcore.isa.capped("avx512", ("linear",)) as got:  # restored after
        if got["linear"] != "avx512":
            pytest.skip("linear avx512 not run: this CPU lacks AVX512_BF16")
        n, k = LINEAR_SHAPES["qkv"]
        w, x, bias = linear_case(n, k, 37, seed=3)
        packed = llmcore.PackedWeight(w)
        whole = llmcore.linear(x, packed, bias, torch.empty(37, n))
        for m in (1, 4, 16):
            part = llmcore.linear(x[:m].contiguous(), packed, bias, torch.empty(m, n))
            assert torch.equal(part, whole[:m]), m
        rows = [5, 30, 2]  # any rows, in any order
        part = llmcore.linear(x[rows].contiguous(), packed, bias, torch.empty(3, n))
        assert torch.equal(part, whole[rows])
