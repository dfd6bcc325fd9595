"""GGUF Q4_K, Q5_K, Q6_K, Q5_0 and Q5_1 matrices kept quantized by the core.

Blocks come from gguf-py's quantize where it has one (Q5_0, Q5_1) and otherwise are random
valid bytes (random quants, sub-scales and mins, random fp16 superblock scales of either
sign). Checked: rows() against gguf-py's dequantize bit for bit; the scalar kernel against a
float64 product of the dequantized weight and the activations as the kernel rounds them
(int16 per 32-block), within fp32 accumulation; every variant this CPU runs bit-equal to the
scalar one on awkward shapes; the packed size as documented; malformed input refused.
"""

from __future__ import annotations

from typing import Any

import llmcore
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

TYPES = {"q5_0": 6, "q5_1": 7, "q4_k": 12, "q5_k": 13, "q6_k": 14}
# Packed bits per weight (weight_quant.h's kFormats) for N a multiple of 16.
BITS = {"q5_0": 5.5, "q5_1": 6.0, "q4_k": 4.625, "q5_k": 5.625, "q6_k": 6.5625}
ISAS = ("scalar", "avx2", "avx512")


def _type(name: str) -> Any:
    return gguf.GGMLQuantizationType(TYPES[name])


def _f16(rng: np.random.Generator, n: int, lo: float, hi: float) -> np.ndarray:
    """n fp16 values of random sign with magnitudes log-uniform in [lo, hi), as bytes."""
    mag = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
    return (mag * rng.choice([-1.0, 1.0], n)).astype(np.float16).view(np.uint8).reshape(n, 2)


def random_blocks(name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """[n, k / block * bytes] uint8: n rows of valid GGUF blocks of type `name`."""
    rng = np.random.default_rng(seed)
    t = _type(name)
    if name in ("q5_0", "q5_1"):  # gguf-py quantizes these as llama.cpp does
        w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
        return gguf.quants.quantize(w, t)
    elems, size = gguf.GGML_QUANT_SIZES[t]
    blocks = rng.integers(0, 256, (n * (k // elems), size), dtype=np.uint8)
    if name == "q6_k":
        blocks[:, 208:210] = _f16(rng, len(blocks), 1e-4, 2e-3)  # d after ql, qh, scales
    else:
        blocks[:, 0:2] = _f16(rng, len(blocks), 1e-4, 2e-3)  # d
        blocks[:, 2:4] = _f16(rng, len(blocks), 1e-4, 2e-3)  # dmin
    return blocks.reshape(n, -1)


def _dequantized(name: str, raw: np.ndarray) -> np.ndarray:
    return gguf.quants.dequantize(raw, _type(name)).astype(np.float32)


def _rounded_x(x: np.ndarray, bits: int) -> np.ndarray:
    """x as the kernel rounds it, float64: per 32-block s = max|x| / qmax and
    q = round-half-even(x * (1 / s)) clamped to +-qmax, all in fp32."""
    qmax = np.float32(2 ** (bits - 1) - 1)
    blocks = x.reshape(x.shape[0], -1, 32)
    s = (np.abs(blocks).max(-1, keepdims=True) / qmax).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(s != 0, np.float32(1) / s, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint((blocks * inv).astype(np.float32)), -qmax, qmax)
    return (q.astype(np.float64) * s.astype(np.float64)).reshape(x.shape)


def _run(packed: Any, x: np.ndarray, bias: np.ndarray | None, isa: str) -> np.ndarray:
    with llmcore.isa.capped(isa, ("linear",)):
        return llmcore.linear(x, packed, bias, np.empty((x.shape[0], packed.shape[0]), np.float32))


def _variants() -> list[str]:
    """The linear variants this CPU runs (avx512 needs AVX512_VNNI for the quantized ones)."""
    vnni = _has_vnni()
    out = []
    for isa in ISAS:
        with llmcore.isa.capped(isa, ("linear",)) as got:
            if got["linear"] == isa and (isa != "avx512" or vnni):
                out.append(isa)
    return out


def _has_vnni() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return "avx512_vnni" in f.read()
    except OSError:
        return False


@pytest.fixture
def bits16() -> Any:
    before = llmcore._C.quant_activation_bits()
    llmcore._C.set_quant_activation_bits(16)
    yield
    llmcore._C.set_quant_activation_bits(before)


@pytest.mark.parametrize("name", sorted(TYPES))
def test_rows_equal_gguf_dequantize(name: str) -> None:
    n, k = 37, 512
    raw = random_blocks(name, n, k, seed=1)
    w = _dequantized(name, raw)
    packed = llmcore.PackedWeight.from_gguf(TYPES[name], raw, n, k)
    assert (packed.dtype, packed.quant_type, packed.shape) == (name, TYPES[name], (n, k))
    ids = np.array([36, 0, 17, 16, 15, 36], np.int64)
    out = packed.rows(ids, np.empty((len(ids), k), np.float32))
    np.testing.assert_array_equal(out.view(np.uint32), w[ids].view(np.uint32))  # signs of 0 too
    every = packed.rows(np.arange(n), np.empty((n, k), np.float32))
    np.testing.assert_array_equal(every.view(np.uint32), w.view(np.uint32))
    import torch

    bf = packed.rows(ids, torch.empty((len(ids), k), dtype=torch.bfloat16))
    assert torch.equal(bf, torch.from_numpy(w[ids]).bfloat16())


@pytest.mark.parametrize("name", sorted(TYPES))
def test_packed_size_is_as_documented(name: str) -> None:
    n, k = 64, 1024
    packed = llmcore.PackedWeight.from_gguf(TYPES[name], random_blocks(name, n, k), n, k)
    assert packed.nbytes * 8 == BITS[name] * n * k
    elems, size = gguf.GGML_QUANT_SIZES[_type(name)]
    assert BITS[name] - size * 8 / elems <= 0.125  # at most 1/8 bit over GGUF's own


@pytest.mark.parametrize("name", sorted(TYPES))
@pytest.mark.parametrize("m", [1, 5, 16])
def test_scalar_kernel_matches_float64(name: str, m: int, bits16: Any) -> None:
    n, k = 40, 768  # three superblocks
    raw = random_blocks(name, n, k, seed=m)
    w = _dequantized(name, raw).astype(np.float64)
    packed = llmcore.PackedWeight.from_gguf(TYPES[name], raw, n, k)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, 32:64] *= 1e-3  # blocks of very different scales
    x[0, 64:96] = 0.0  # and an all-zero one
    bias = rng.standard_normal(n).astype(np.float32)
    got = _run(packed, x, bias, "scalar").astype(np.float64)
    xq = _rounded_x(x, 16)
    ref = xq @ w.T + bias
    # fp32 rounding: a few ulps per block term (scale products, int -> float) and per
    # accumulation step, of the magnitudes summed.
    mag = np.abs(xq) @ np.abs(w).T + np.abs(bias)
    bound = 2.0 ** -24 * (k // 32 + 8) * mag
    err = np.abs(got - ref)
    assert (err <= bound).all(), f"worst {float((err / bound).max()):.2f} x the bound"
    # and the activation rounding itself is small against the unrounded product
    exact = x.astype(np.float64) @ w.T + bias
    assert float(np.abs(got - exact).max()) < 1e-4 * float(np.abs(exact).max())


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("name", sorted(TYPES))
def test_variants_bit_equal_to_scalar(name: str, bits: int) -> None:
    variants = _variants()
    before = llmcore._C.quant_activation_bits()
    assert llmcore._C.set_quant_activation_bits(bits) == bits
    try:
        for n, k, ms in ((7, 256, (1, 3, 9)), (40, 1024, (1, 2, 5, 8, 13, 17)), (33, 512, (64,))):
            raw = random_blocks(name, n, k, seed=n + k)
            packed = llmcore.PackedWeight.from_gguf(TYPES[name], raw, n, k)
            rng = np.random.default_rng(n)
            for m in ms:
                x = rng.standard_normal((m, k)).astype(np.float32)
                bias = rng.standard_normal(n).astype(np.float32) if m % 2 else None
                ref = _run(packed, x, bias, "scalar")
                for isa in variants:
                    got = _run(packed, x, bias, isa)
                    np.testing.assert_array_equal(
                        got.view(np.uint32), ref.view(np.uint32),
                        err_msg=f"{name} {isa} int{bits} M={m} N={n} K={k}")
    finally:
        llmcore._C.set_quant_activation_bits(before)


def test_variants_ran() -> None:
    """Which variants the bit-equality test compares on this CPU (AVX2 and AVX-512 on the
    machines this project builds on)."""
    assert _variants()[0] == "scalar"


@pytest.mark.parametrize("name", sorted(TYPES))
def test_malformed_blocks_are_refused(name: str) -> None:
    t = TYPES[name]
    elems, size = gguf.GGML_QUANT_SIZES[_type(name)]
    raw = random_blocks(name, 4, 512)
    with pytest.raises(ValueError, match="bytes"):
        llmcore.PackedWeight.from_gguf(t, raw.reshape(-1)[:-1], 4, 512)
    with pytest.raises(ValueError, match="bytes"):
        llmcore.PackedWeight.from_gguf(t, raw, 5, 512)
    if elems == 256:
        with pytest.raises(ValueError, match="multiple of 256"):
            llmcore.PackedWeight.from_gguf(t, np.zeros(4 * 3 * size // 2, np.uint8), 4, 384)
    with pytest.raises(ValueError, match=f"multiple of {elems}"):
        llmcore.PackedWeight.from_gguf(t, raw, 4, 0)
    with pytest.raises(ValueError, match="N > 0"):
        llmcore.PackedWeight.from_gguf(t, raw, -1, 512)
    with pytest.raises(ValueError, match="out of range"):
        llmcore.PackedWeight.from_gguf(t, raw, 4, 512).rows(np.array([4]), np.empty((1, 512), np.float32))


def test_unkept_types_are_refused() -> None:
    for t in (10, 11, 15, 1, 0, 99):  # Q2_K, Q3_K, Q8_K, F16, F32, none
        with pytest.raises(ValueError, match="unsupported quantization type"):
            llmcore.PackedWeight.from_gguf(t, np.zeros(210, np.uint8), 1, 256)


def test_kept_types_are_exported_and_used() -> None:
    from actors.loader.gguf import QUANT_TYPES
    from actors.models.linear_routing import QUANTIZED

    kept = {2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 12: "q4_k", 13: "q5_k",
            14: "q6_k"}
    assert llmcore.GGUF_KEPT_TYPES == kept
    assert QUANT_TYPES == kept and set(QUANTIZED) == set(kept.values())
    for num, name in kept.items():
        assert gguf.GGMLQuantizationType(num).name.lower() == name
