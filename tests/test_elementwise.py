"""llmcore's elementwise layer operations against their torch definitions."""

from __future__ import annotations

from typing import Any

import llmcore
import pytest
import torch
import torch.nn.functional as F


@pytest.fixture(params=["avx512", "avx2", "scalar"])
def isa(request: pytest.FixtureRequest, isa_record: Any):
    with llmcore.isa.capped(request.param, ("elementwise",)) as got:
        if got["elementwise"] != request.param:
            why = (f"this CPU does not run {request.param} (AVX-512F for avx512, AVX2+FMA for "
                   f"avx2): the elementwise kernels run {got['elementwise']} at most")
            isa_record.skipped("elementwise", request.param, why)
            pytest.skip(why)
        yield request.param
        if request.param != "scalar":  # checked against torch and, for RoPE, scalar
            isa_record.ran("elementwise", request.param)


def _rms_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w.float() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@pytest.mark.parametrize("t,h", [(1, 576), (7, 100), (300, 64), (3, 5), (2, 47)])
@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_rms_norm(isa: str, t: int, h: int, wdtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(t * h)
    x = torch.randn(t, h, generator=g) * 3
    w = torch.randn(h, generator=g).to(wdtype)
    out = torch.empty_like(x)
    assert llmcore.rms_norm(x, w, 1e-5, out) is out
    torch.testing.assert_close(out, _rms_ref(x, w, 1e-5), rtol=1e-5, atol=1e-5)
    # in place
    y = x.clone()
    llmcore.rms_norm(y, w, 1e-5, y)
    torch.testing.assert_close(y, out, rtol=0, atol=0)


def test_rms_norm_with_residual_adds_then_normalises(isa: str) -> None:
    g = torch.Generator().manual_seed(1)
    base = torch.randn(5, 40, generator=g)
    x = base[:, :33]  # row stride 40
    res = torch.randn(5, 33, generator=g)
    w = torch.randn(33, generator=g)
    want_res = res + x
    out = torch.empty(5, 33)
    llmcore.rms_norm(x, w, 1e-6, out, residual=res)
    torch.testing.assert_close(res, want_res, rtol=0, atol=0)
    torch.testing.assert_close(out, _rms_ref(want_res, w, 1e-6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("t,i", [(1, 1536), (4, 13), (200, 256)])
def test_silu_mul(isa: str, t: int, i: int) -> None:
    g = torch.Generator().manual_seed(i)
    x = torch.randn(t, 2 * i, generator=g) * 6
    x[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # saturated and zero gates
    out = torch.empty(t, i)
    llmcore.silu_mul(x, out)
    want = F.silu(x[:, :i]) * x[:, i:]
    torch.testing.assert_close(out, want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("d", [64, 40, 128])  # 40: a half of 20 is no whole vector
def test_rope_matches_rotate_half_on_strided_views(isa: str, d: int) -> None:
    from actors.models.rope import RotaryEmbedding, apply_rotary_

    t, hq, hk = 6, 4, 2
    rope = RotaryEmbedding(d, 128, 10000.0, None)
    pos = torch.tensor([0, 1, 5, 17, 100, 127])
    cos, sin = rope(pos, torch.float32)
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(t, (hq + 2 * hk) * d, generator=g)
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d: (hq + hk) * d].view(t, hk, d)
    v_before = qkv[:, (hq + hk) * d:].clone()
    q_ref, k_ref = q.clone(), k.clone()
    apply_rotary_(q_ref, k_ref, (cos, sin))
    q_in, k_in = q.clone(), k.clone()
    llmcore.rope(q, k, cos[:, 0], sin[:, 0])
    torch.testing.assert_close(q, q_ref, rtol=1e-6, atol=1e-6)
    # Every variant rounds each product on its own, as the scalar kernel: the same bits
    # (a fused multiply-add here moved a bf16 model's outputs past test_models' tolerance).
    with llmcore.isa.capped("scalar", ("elementwise",)):
        llmcore.rope(q_in, k_in, cos[:, 0], sin[:, 0])
    assert torch.equal(q, q_in) and torch.equal(k, k_in)
    torch.testing.assert_close(k, k_ref, rtol=1e-6, atol=1e-6)
    assert torch.equal(qkv[:, (hq + hk) * d:], v_before)  # v untouched


def test_errors_are_value_errors() -> None:
    x = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="weight must have 8"):
        llmcore.rms_norm(x, torch.ones(7), 1e-5, torch.empty(2, 8))
    with pytest.raises(ValueError, match="float32"):
        llmcore.rms_norm(x.double(), torch.ones(8), 1e-5, torch.empty(2, 8))
    with pytest.raises(ValueError, match="residual must not overlap"):
        llmcore.rms_norm(x, torch.ones(8), 1e-5, torch.empty(2, 8), residual=x)
    # Partial overlaps (row-shifted views of one buffer) would race across threads.
    buf = torch.zeros(3, 8)
    with pytest.raises(ValueError, match="residual must not overlap"):
        llmcore.rms_norm(buf[:2], torch.ones(8), 1e-5, torch.empty(2, 8), residual=buf[1:])
    with pytest.raises(ValueError, match="out must be x or not overlap"):
        llmcore.rms_norm(buf[:2], torch.ones(8), 1e-5, buf[1:])
    y = torch.randn(2, 8)
    want = llmcore.rms_norm(y, torch.ones(8), 1e-5, torch.empty(2, 8)).clone()
    torch.testing.assert_close(llmcore.rms_norm(y, torch.ones(8), 1e-5, y), want)  # in place
    for set_isa in (llmcore.set_elementwise_isa, llmcore._C.set_linear_isa):
        with pytest.raises(ValueError, match="unknown instruction set"):
            set_isa("sse")  # once quietly taken as avx2
    with pytest.raises(ValueError, match=r"\[T, I\]"):
        llmcore.silu_mul(x, torch.empty(2, 3))
    with pytest.raises(ValueError, match="head size"):
        llmcore.rope(torch.zeros(2, 1, 8), None, torch.zeros(2, 3), torch.zeros(2, 3))
