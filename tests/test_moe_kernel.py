"""The grouped mixture-of-experts product (``llmcore.moe_experts``) against a float64 loop over
experts on the same (dequantized) weights, for float32, bfloat16 and GGUF quantized experts;
its bits on every linear instruction set this CPU runs (quantized: the scalar bits; float:
within fp32 rounding, as the packed linear); batch invariance (a token alone gives the bits it
gets inside any batch, any thread count); and the refusals at its boundary."""

from __future__ import annotations

from typing import Any

import llmcore
import numpy as np
import pytest
import torch
from llmcore import PackedExperts, PackedWeight, moe_experts, pack_experts

gguf = pytest.importorskip("gguf")

GGML = {"q8_0": 8, "q4_0": 2, "q4_1": 3}
FORMATS = ("float32", "bfloat16", "q8_0", "q4_0")
ISAS = ("scalar", "avx2", "avx512")
# max |error| / max |reference| allowed: fp32 sums; bf16 activations (AVX512_BF16 kernel);
# activations rounded per 32-block to int16 (quantized).
TOL = {"float32": 5e-6, "bfloat16": 1e-2, "q8_0": 5e-4, "q4_0": 5e-4, "q4_1": 5e-4}


def _matrix(fmt: str, w: np.ndarray) -> tuple[PackedWeight, np.ndarray]:
    """(w packed in fmt, the float64 values the core multiplies with)."""
    if fmt == "float32":
        w32 = w.astype(np.float32)
        return PackedWeight(torch.from_numpy(w32)), w32.astype(np.float64)
    if fmt == "bfloat16":
        b = torch.from_numpy(w.astype(np.float32)).bfloat16()
        return PackedWeight(b), b.double().numpy()
    t = gguf.GGMLQuantizationType(GGML[fmt])
    q = gguf.quants.quantize(w.astype(np.float32), t)
    return (PackedWeight.from_gguf(GGML[fmt], q, *w.shape),
            gguf.quants.dequantize(q, t).astype(np.float64))


class Experts:
    """E random SiLU-gated experts in one format (or gate/up and down in two)."""

    def __init__(self, fmt: str, e: int, h: int, i: int, seed: int = 0,
                 down_fmt: str | None = None) -> None:
        rng = np.random.default_rng(seed)
        gu = [_matrix(fmt, rng.standard_normal((2 * i, h)) / np.sqrt(h)) for _ in range(e)]
        dn = [_matrix(down_fmt or fmt, rng.standard_normal((h, i)) / np.sqrt(i)) for _ in range(e)]
        self.gate_up = [p for p, _ in gu]
        self.down = [p for p, _ in dn]
        self.packed = PackedExperts(self.gate_up, self.down)
        self.ref_gate_up = np.stack([r for _, r in gu])
        self.ref_down = np.stack([r for _, r in dn])
        self.e, self.h, self.i = e, h, i

    def reference(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """float64, one expert at a time over the rows routed to it."""
        x64, w64 = x.double(), w.double()
        out = torch.zeros(x.shape[0], self.h, dtype=torch.float64)
        for e in range(self.e):
            rows, js = torch.nonzero(ids == e, as_tuple=True)
            if len(rows) == 0:
                continue
            h = x64[rows] @ torch.from_numpy(self.ref_gate_up[e]).T
            a = torch.nn.functional.silu(h[:, : self.i]) * h[:, self.i :]
            y = a @ torch.from_numpy(self.ref_down[e]).T
            out.index_add_(0, rows, y * w64[rows, js, None])
        return out


def _routing(t: int, k: int, e: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct top-k ids per row (as a softmax router picks them) and renormalised weights."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(t, e, generator=g)
    w, ids = torch.softmax(logits, -1).topk(k, -1)
    return ids, (w / w.sum(-1, keepdim=True)).float()


def _check(fmt: str, got: torch.Tensor, want: torch.Tensor) -> None:
    err = (got.double() - want).abs().max().item()
    top = want.abs().max().item()
    assert err <= TOL[fmt] * top, f"{fmt}: max error {err:.3g} of {top:.3g}"


def _isa(isa: str, isa_record: Any) -> str:
    got = llmcore.isa.set_isa("linear", isa)
    if got != isa:
        why = "this CPU lacks AVX512_BF16" if isa == "avx512" else f"this CPU runs {got} at most"
        isa_record.skipped("moe", isa, why)
        pytest.skip(f"linear {isa} not run: {why}")
    return got


@pytest.fixture
def restore_isa() -> Any:
    before = llmcore.linear_isa()
    yield
    llmcore.isa.set_isa("linear", before)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("t,k,e", [(1, 1, 4), (1, 8, 64), (5, 2, 4), (37, 8, 16), (300, 8, 64),
                                   (64, 2, 64)])
def test_matches_float64_reference(fmt: str, t: int, k: int, e: int) -> None:
    ex = Experts(fmt, e, h=128, i=64, seed=t + k + e)
    x = torch.randn(t, 128, generator=torch.Generator().manual_seed(t))
    ids, w = _routing(t, k, e, seed=t * k)
    got = moe_experts(x, ids, w, ex.packed)
    assert got.shape == (t, 128) and got.dtype == torch.float32
    _check(fmt, got, ex.reference(x, ids, w))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("isa", ISAS)
def test_every_linear_isa(fmt: str, isa: str, isa_record: Any, restore_isa: Any) -> None:
    """Quantized experts: every variant gives the scalar bits. Float experts: within fp32
    rounding of the reference (the scalar kernel does not fuse multiply-adds, AVX2 does, and
    the AVX512_BF16 one rounds activations to bf16: the packed linear's own differences)."""
    ex = Experts(fmt, 16, h=96 if fmt in ("float32", "bfloat16") else 128, i=64, seed=5)
    x = torch.randn(40, ex.h, generator=torch.Generator().manual_seed(2))
    ids, w = _routing(40, 8, 16, seed=9)
    _isa(isa, isa_record)
    got = moe_experts(x, ids, w, ex.packed)
    bf16_activations = fmt == "bfloat16" and isa == "avx512"
    _check(fmt if bf16_activations or fmt != "bfloat16" else "float32", got,
           ex.reference(x, ids, w))
    if fmt.startswith("q"):
        llmcore.isa.set_isa("linear", "scalar")
        assert torch.equal(got, moe_experts(x, ids, w, ex.packed))
    isa_record.ran("moe", isa)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("isa", ISAS)
def test_batch_invariant(fmt: str, isa: str, isa_record: Any, restore_isa: Any) -> None:
    """A token's output does not depend on the other tokens of the batch: alone (each used
    expert then has one row; decode's one-expert-per-worker split), inside batches of other
    sizes and orders (experts with 1, 2, 3 ... 30 rows; one expert after another), for any
    thread count: the same bits."""
    ex = Experts(fmt, 8, h=128, i=96, seed=11)
    t = 90
    x = torch.randn(t, 128, generator=torch.Generator().manual_seed(4))
    ids, w = _routing(t, 4, 8, seed=6)
    _isa(isa, isa_record)
    whole = moe_experts(x, ids, w, ex.packed)
    for r in (0, 1, 45, 89):
        alone = moe_experts(x[r : r + 1], ids[r : r + 1], w[r : r + 1], ex.packed)
        assert torch.equal(alone[0], whole[r]), r
    for rows in ([5, 30, 2], list(range(7)), list(range(89, 10, -3))):
        part = moe_experts(x[rows], ids[rows], w[rows], ex.packed)
        assert torch.equal(part, whole[rows]), rows
    threads = llmcore.get_num_threads()
    try:
        llmcore.set_num_threads(1)
        assert torch.equal(moe_experts(x, ids, w, ex.packed), whole)
        assert torch.equal(moe_experts(x[:1], ids[:1], w[:1], ex.packed)[0], whole[0])
    finally:
        llmcore.set_num_threads(threads)
    isa_record.ran("moe", isa)


def test_long_prefill() -> None:
    """A call whose scratch passes the 64 MiB kept between calls (T * k * (H + 2I) floats) gets
    its own buffer: the same bits per row as small calls before and after it."""
    ex = Experts("bfloat16", 4, h=1024, i=32, seed=12)
    t = 2048
    x = torch.randn(t, 1024, generator=torch.Generator().manual_seed(5))
    ids, w = _routing(t, 4, 4, seed=8)
    ids = torch.cat([ids, ids.flip(-1)], -1)  # k = 8 (each expert twice): 16384 rows
    w = torch.cat([w, w], -1) / 2
    rows = [0, 1000, 2047]
    before = moe_experts(x[rows], ids[rows], w[rows], ex.packed)
    whole = moe_experts(x, ids, w, ex.packed)
    assert torch.equal(whole[rows], before)
    assert torch.equal(moe_experts(x[rows], ids[rows], w[rows], ex.packed), before)


def test_terms_add_in_top_k_order() -> None:
    """The k contributions are summed in the order of the row's list: swapping two entries of
    a row's top-k list may change the last bit, never more, and the same list gives the same
    bits whatever other rows sit in the batch."""
    ex = Experts("float32", 6, h=64, i=32, seed=1)
    x = torch.randn(3, 64)
    ids = torch.tensor([[0, 1, 2], [2, 1, 0], [0, 1, 2]])
    w = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5], [0.5, 0.3, 0.2]])
    x[1] = x[0]
    x[2] = x[0]
    got = moe_experts(x, ids, w, ex.packed)
    assert torch.equal(got[0], got[2])
    torch.testing.assert_close(got[0], got[1], rtol=1e-6, atol=1e-6)
    want = ex.reference(x, ids, w)
    _check("float32", got, want)


def test_experts_without_rows_and_repeated_ids() -> None:
    """Unused experts cost nothing and change nothing; a repeated id in a row counts once per
    occurrence (w1 * f(x) + w2 * f(x))."""
    ex = Experts("float32", 64, h=64, i=32, seed=2)
    x = torch.randn(6, 64)
    ids = torch.full((6, 2), 7)
    ids[:3, 1] = 63
    w = torch.rand(6, 2)
    got = moe_experts(x, ids, w, ex.packed)
    _check("float32", got, ex.reference(x, ids, w))
    one = moe_experts(x, ids[:, :1], torch.ones(6, 1), ex.packed)
    torch.testing.assert_close(got[3:], one[3:] * (w[3:, :1] + w[3:, 1:]), rtol=1e-5, atol=1e-5)


def test_int32_ids_numpy_inputs_lists_and_in_place() -> None:
    ex = Experts("bfloat16", 8, h=64, i=32, seed=3)
    x = torch.randn(9, 64)
    ids, w = _routing(9, 2, 8, seed=1)
    want = moe_experts(x, ids, w, ex.packed)
    assert torch.equal(moe_experts(x, ids.int(), w, ex.packed), want)
    got_np = moe_experts(x.numpy(), ids.numpy(), w.numpy(), ex.packed)
    assert isinstance(got_np, np.ndarray) and np.array_equal(got_np, want.numpy())
    out = torch.empty(9, 64)
    assert llmcore._C.moe_experts(x, ids, w, ex.gate_up, ex.down, out) is out
    assert torch.equal(out, want)
    y = x.clone()
    moe_experts(y, ids, w, ex.packed, out=y)  # in place: x is read in full first
    assert torch.equal(y, want)
    # strided rows (a view into a wider buffer) for x, the weights and out
    wide = torch.zeros(9, 80)
    wide[:, 8:72] = x
    wide_out = torch.zeros(9, 100)
    wide_w = torch.zeros(9, 5)
    wide_w[:, 1:3] = w
    moe_experts(wide[:, 8:72], ids, wide_w[:, 1:3], ex.packed, out=wide_out[:, 10:74])
    assert torch.equal(wide_out[:, 10:74], want)


def test_pack_experts_from_stacked_tensors() -> None:
    g = torch.Generator().manual_seed(9)
    gate_up, down = torch.randn(4, 64, 48, generator=g), torch.randn(4, 48, 32, generator=g)
    packed = pack_experts(gate_up.bfloat16(), down.bfloat16())
    assert (len(packed), packed.hidden_size, packed.intermediate_size) == (4, 48, 32)
    assert packed.nbytes >= 4 * (64 * 48 + 48 * 32) * 2
    x = torch.randn(5, 48, generator=g)
    ids, w = _routing(5, 2, 4, seed=4)
    one_by_one = PackedExperts([PackedWeight(m.bfloat16()) for m in gate_up],
                               [PackedWeight(m.bfloat16()) for m in down])
    assert torch.equal(moe_experts(x, ids, w, packed), moe_experts(x, ids, w, one_by_one))


def test_mixed_formats() -> None:
    """gate/up and down may be of different formats (GGUF files often mix them)."""
    ex = Experts("q8_0", 8, h=128, i=64, seed=4, down_fmt="q4_1")
    x = torch.randn(12, 128)
    ids, w = _routing(12, 2, 8, seed=2)
    _check("q8_0", moe_experts(x, ids, w, ex.packed), ex.reference(x, ids, w))
    mixed = PackedExperts(ex.gate_up[:4] + Experts("bfloat16", 4, 128, 64, seed=5).gate_up, ex.down)
    assert mixed.num_experts == 8 and len(mixed) == 8
    assert (mixed.hidden_size, mixed.intermediate_size) == (128, 64)
    assert moe_experts(x, ids, w, mixed).isfinite().all()


def test_refusals() -> None:
    ex = Experts("float32", 4, h=64, i=32, seed=6)
    x = torch.randn(3, 64)
    ids, w = _routing(3, 2, 4, seed=3)
    bad_ids = ids.clone()
    bad_ids[1, 1] = 4
    with pytest.raises(ValueError, match=r"topk_ids\[1, 1\] = 4 is not an expert"):
        moe_experts(x, bad_ids, w, ex.packed)
    bad_ids[1, 1] = -1
    with pytest.raises(ValueError, match=r"= -1 is not an expert"):
        moe_experts(x, bad_ids.int(), w, ex.packed)
    with pytest.raises(ValueError, match="topk_weights' shape"):
        moe_experts(x, ids[:, :1], w, ex.packed)
    with pytest.raises(ValueError, match="topk_weights .* must be \\[T, k\\]"):
        moe_experts(x, ids[:2], w[:2], ex.packed)
    with pytest.raises(TypeError, match="int32 or int64"):
        moe_experts(x, ids.float(), w, ex.packed)
    with pytest.raises(ValueError, match="topk_weights must be float32"):
        moe_experts(x, ids, w.bfloat16(), ex.packed)
    with pytest.raises(ValueError, match="x must be float32"):
        moe_experts(x.bfloat16(), ids, w, ex.packed)
    with pytest.raises(ValueError, match=r"gate_up\[0\] is \[64, 64\], expected \[64, 48\]"):
        moe_experts(torch.randn(3, 48), ids, w, ex.packed)
    with pytest.raises(ValueError, match="out .* must be"):
        moe_experts(x, ids, w, ex.packed, out=torch.empty(3, 32))
    with pytest.raises(ValueError, match="overlap"):
        buf = torch.randn(4, 64)
        moe_experts(buf[:3], ids, w, ex.packed, out=buf[1:])
    other = Experts("float32", 1, h=64, i=16, seed=7)
    with pytest.raises(ValueError, match=r"gate_up\[4\] is \[32, 64\], expected \[64, 64\]"):
        PackedExperts(ex.gate_up + other.gate_up, ex.down + other.down)
    with pytest.raises(ValueError, match=r"down\[1\] is \[64, 16\], expected \[64, 32\]"):
        PackedExperts(ex.gate_up[:2], [ex.down[0], other.down[0]])
    with pytest.raises(ValueError, match="same number"):
        PackedExperts(ex.gate_up, ex.down[:3])
    with pytest.raises(ValueError, match="same number"):
        PackedExperts([], [])
    with pytest.raises(TypeError, match=r"down\[0\] must be a PackedWeight"):
        PackedExperts(ex.gate_up[:1], [torch.randn(64, 32)])
    with pytest.raises(ValueError, match=r"gate_up\[0\] must be \[2 \* I, H\]"):
        odd = PackedWeight(torch.randn(63, 64))
        PackedExperts([odd], ex.down[:1])
    # two lists of 2 experts: the ids are checked by the core against E = 2
    with pytest.raises(ValueError, match=r"is not an expert \(0 <= id < 2\)"):
        llmcore._C.moe_experts(x, ids, w, ex.gate_up[:2], ex.down[:2], torch.empty(3, 64))
    # nothing was written by a refused call, and the op still works
    _check("float32", moe_experts(x, ids, w, ex.packed), ex.reference(x, ids, w))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device to make a CUDA tensor")
def test_cuda_tensors_are_refused() -> None:
    ex = Experts("float32", 4, h=64, i=32, seed=8)
    ids, w = _routing(2, 2, 4, seed=1)
    with pytest.raises(NotImplementedError, match="CPU only"):
        moe_experts(torch.randn(2, 64, device="cuda"), ids, w, ex.packed)
    with pytest.raises(NotImplementedError, match="CPU only"):
        moe_experts(torch.randn(2, 64), ids.cuda(), w, ex.packed)
