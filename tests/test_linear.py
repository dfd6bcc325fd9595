"""llmcore.linear against torch: fp32 matmul of the same (bf16-rounded) weights."""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
from typing import Any

import llmcore
import numpy as np
import pytest
import torch

MS = [1, 2, 3, 7, 8, 9, 33, 64, 257]
KS = [576, 1536, 64, 100]
NS = [1, 15, 192, 1536, 3072]


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    out = x @ w.float().T
    return out if b is None else out + b.float()


def _tol(k: int) -> float:
    # fp32 accumulation in a different order than the reference: ~sqrt(K) roundings of
    # partial sums that grow like sqrt(K) for unit-variance inputs.
    return 2e-5 * math.sqrt(k)


@pytest.mark.parametrize("m", MS)
def test_matches_torch(m: int) -> None:
    gen = torch.Generator().manual_seed(m)
    for i, (k, n) in enumerate(itertools.product(KS, NS)):
        if m * n * k > 300_000_000 and i % 2:
            continue  # keep the file fast: half of the largest products
        bf16 = (i + m) % 2 == 0
        with_bias = i % 3 != 0
        strided = i % 4 == 1
        w = torch.randn(n, k, generator=gen)
        w = w.bfloat16() if bf16 else w
        b = torch.randn(n, generator=gen) if with_bias else None
        base = torch.randn(m, k + (5 if strided else 0), generator=gen)
        x = base[:, :k]
        got = llmcore.linear(x, w, b)
        want = _reference(x, w.float(), b)
        assert got.shape == (m, n) and got.dtype == torch.float32
        case = f"m={m} k={k} n={n} bf16={bf16}"
        torch.testing.assert_close(got, want, rtol=_tol(k), atol=_tol(k),
                                   msg=lambda s, case=case: f"{case}: {s}")


def test_out_is_filled_and_returned_with_row_stride() -> None:
    x = torch.randn(5, 64)
    w = torch.randn(24, 64).bfloat16()
    b = torch.randn(24).bfloat16()
    buf = torch.full((5, 30), -3.0)
    out = buf[:, 2:26]
    res = llmcore.linear(x, w, b, out)
    assert res is out
    torch.testing.assert_close(out, _reference(x, w.float(), b.float()), rtol=1e-4, atol=1e-4)
    assert (buf[:, :2] == -3.0).all() and (buf[:, 26:] == -3.0).all()


def test_bf16_out_is_rounded_result() -> None:
    x = torch.randn(9, 100)
    w = torch.randn(40, 100).bfloat16()
    out = torch.empty(9, 40, dtype=torch.bfloat16)
    llmcore.linear(x, w, None, out)
    want = _reference(x, w.float(), None).bfloat16()
    # Rounding the fp32 result to bf16 may land one bf16 ulp away from rounding the
    # exact result.
    torch.testing.assert_close(out.float(), want.float(), rtol=1 / 128, atol=1e-3)


def test_numpy_and_leading_dims() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 64), dtype=np.float32)
    w = rng.standard_normal((10, 64), dtype=np.float32)
    got = llmcore.linear(x, w)
    assert isinstance(got, np.ndarray) and got.shape == (2, 3, 10)
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-4, atol=1e-4)
    xt = torch.from_numpy(x)
    got_t = llmcore.linear(xt, torch.from_numpy(w).bfloat16())
    assert got_t.shape == (2, 3, 10)


def test_same_bits_for_any_thread_count() -> None:
    x = torch.randn(70, 576)
    w = torch.randn(1000, 576).bfloat16()
    before = llmcore.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            llmcore.set_num_threads(threads)
            results.append(llmcore.linear(x, w))
            results.append(llmcore.linear(x[:3], w))
    finally:
        llmcore.set_num_threads(before)
    for r in results[2:]:
        assert torch.equal(r, results[len(r) != 70])


def test_errors() -> None:
    x = torch.randn(4, 64)
    w = torch.randn(8, 64).bfloat16()
    with pytest.raises(ValueError, match="weight"):
        llmcore.linear(x, torch.randn(8, 63))
    with pytest.raises(ValueError, match="out"):
        llmcore.linear(x, w, None, torch.empty(4, 7))
    with pytest.raises(ValueError, match="bias"):
        llmcore.linear(x, w, torch.randn(7))
    with pytest.raises(ValueError, match="x must be float32"):
        llmcore.linear(x.bfloat16(), w)
    with pytest.raises(ValueError, match="weight must be"):
        llmcore.linear(x, w.half())
    with pytest.raises(ValueError, match="weight must be contiguous"):
        llmcore.linear(x[:, :32], torch.randn(8, 64)[:, :32])
    with pytest.raises(ValueError, match="overlap"):
        llmcore.linear(x, torch.randn(4, 64), None, x[:, :4])
    with pytest.raises(ValueError, match="out is required"):
        llmcore._C.linear(x, w)


def test_isa_can_be_forced_to_scalar() -> None:
    code = (
        "import torch, llmcore\n"
        "x = torch.randn(3, 100); w = torch.randn(20, 100).bfloat16()\n"
        "torch.testing.assert_close(llmcore.linear(x, w), x @ w.float().T, rtol=1e-4, atol=1e-4)\n"
        "print(llmcore.linear_isa())\n"
    )
    env = dict(os.environ, LLMCORE_LINEAR_ISA="scalar")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    assert res.stdout.strip() == "scalar"
    from actors.loader.dtype import cpu_flags

    flags = cpu_flags()
    best = ("amx" if llmcore.cpu_isa() == "amx" else "avx512" if "avx512_bf16" in flags else
            "avx2" if {"avx2", "fma"} <= flags else "scalar")
    # the default in a fresh process (this one's setting may have been capped by a test)
    default = subprocess.run([sys.executable, "-c", "import llmcore; print(llmcore.linear_isa())"],
                             env={k: v for k, v in os.environ.items() if k != "LLMCORE_LINEAR_ISA"},
                             capture_output=True, text=True, timeout=60, check=True)
    assert default.stdout.strip() == best


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_model_with_bf16_weights_computes_in_fp32(kind: str, make_tiny_model: Any) -> None:
    """bf16 weights + fp32 activations give the fp32 model's logits on bf16-rounded weights
    (the AVX2 kernels); the AVX512_BF16 kernel rounds the activations to bf16 as well, which
    moves these random-weight logits (|logit| up to ~2) by up to 1.4e-2 (measured)."""
    from actors.loader import load_model
    from actors.models.attention import DenseCausalAttention

    model_dir = make_tiny_model(kind)  # qwen2 has q/k/v biases
    bf = load_model(model_dir, dtype="bfloat16").model
    ref = load_model(model_dir, dtype="float32", pack=False).model
    assert bf.compute_dtype == torch.float32 and ref.compute_dtype == torch.float32
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.bfloat16().float())
    ids = torch.randint(0, ref.config.vocab_size, (12,), generator=torch.Generator().manual_seed(0))
    pos = torch.cat([torch.arange(5), torch.arange(7)])
    with torch.no_grad():
        want = ref(ids, pos, DenseCausalAttention(ref.attention_specs(), [5, 7]))
        with llmcore.isa.capped("avx2", ("linear",)):
            got = bf(ids, pos, DenseCausalAttention(bf.attention_specs(), [5, 7]))
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        if llmcore.linear_isa() in ("avx512", "amx"):
            got = bf(ids, pos, DenseCausalAttention(bf.attention_specs(), [5, 7]))
            assert (got - want).abs().max().item() <= 3e-2 and want.abs().max().item() > 1


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
def test_packed_weight_matches_torch(isa: str) -> None:
    """Packed panels (16 columns, k-major; bf16 in k pairs) give x @ W^T for ragged N, every
    row-block size of the microkernel, strided x, bias and a bf16 out."""
    with llmcore.isa.capped(isa, ("linear",)) as got_isa:
        if got_isa["linear"] != isa:
            pytest.skip(f"this CPU does not run {isa}")
        gen = torch.Generator().manual_seed(5)
        for n, k in [(1, 7), (15, 64), (17, 100), (960, 576), (50, 1536)]:
            for dtype in (torch.float32, torch.bfloat16):
                w = torch.randn(n, k, generator=gen).to(dtype)
                pw = llmcore.PackedWeight(w)
                assert pw.shape == (n, k) and pw.dtype == str(dtype).removeprefix("torch.")
                assert pw.nbytes >= n * k * w.element_size()
                b = torch.randn(n, generator=gen)
                for m in (1, 2, 3, 6, 7, 13, 70):
                    base = torch.randn(m, k + 3, generator=gen)
                    x = base[:, :k]
                    want = x @ w.float().T + b
                    got = llmcore.linear(x, pw, b)
                    torch.testing.assert_close(got, want, rtol=_tol(k), atol=_tol(k))
                    out16 = torch.empty(m, n, dtype=torch.bfloat16)
                    llmcore.linear(x, pw, b, out16)
                    torch.testing.assert_close(out16.float(), got.bfloat16().float(),
                                               rtol=1e-2, atol=1e-2)


def test_packed_weight_rows_and_errors() -> None:
    w = torch.randn(37, 20).bfloat16()
    pw = llmcore.PackedWeight(w)
    ids = np.array([0, 36, 5, 5], dtype=np.int64)
    got = pw.rows(ids, torch.empty(4, 20))
    assert torch.equal(got, w[torch.from_numpy(ids)].float())
    got16 = pw.rows(ids, torch.empty(4, 20, dtype=torch.bfloat16))
    assert torch.equal(got16, w[torch.from_numpy(ids)])
    with pytest.raises(ValueError, match="out of range"):
        pw.rows(np.array([37], dtype=np.int64), torch.empty(1, 20))
    with pytest.raises(ValueError, match="does not match the packed weight"):
        llmcore.linear(torch.randn(2, 21), pw)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        llmcore.PackedWeight(torch.zeros(3, 4, dtype=torch.float16))
    # the source can go away: the packed copy is the core's own
    w2 = torch.randn(16, 8)
    pw2 = llmcore.PackedWeight(w2)
    x = torch.randn(1, 8)
    want = x @ w2.T
    del w2
    torch.testing.assert_close(llmcore.linear(x, pw2), want)
