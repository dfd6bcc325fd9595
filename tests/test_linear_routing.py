"""Per-shape kernel routing (actors.models.linear_routing): the table the timing builds, and
that a routed model computes what the unrouted one does up to the kernels' rounding, fp32
and bf16 weights, every projection and the LM head sent to torch. /server_info's copy of
the table is checked in tests/test_server_dev.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import llmcore
import pytest
import torch

from actors.loader import load_model
from actors.models import linear_routing
from actors.models.linear_routing import BUCKETS, bucket


def _logits(model: Any, ids: list[int]) -> torch.Tensor:
    from actors.models.attention import DenseCausalAttention

    attn = DenseCausalAttention(model.attention_specs(), [len(ids)])
    with torch.inference_mode():
        return model(torch.tensor(ids), torch.arange(len(ids)), attn).float()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 (qkv bias, untied LM head) saved as a HF checkpoint."""
    from conftest import TINY_SIZES, _randomize_
    from transformers import AutoModelForCausalLM, Qwen2Config

    model = AutoModelForCausalLM.from_config(Qwen2Config(**TINY_SIZES, tie_word_embeddings=False),
                                             dtype=torch.float32)
    _randomize_(model, seed=99)
    out = tmp_path_factory.mktemp("routing") / "qwen2"
    model.save_pretrained(out)
    return out


def test_buckets() -> None:
    assert [bucket(m) for m in (1, 2, 3, 8, 22, 23, 64, 127, 128, 256, 4096)] == \
        [0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert BUCKETS == (1, 8, 64, 256)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_routed_outputs_match_unrouted(tiny_dir: Path, dtype: str) -> None:
    """Every float matrix forced to torch: logits at each bucket's row count against the
    same model on the core's kernels (fp32: summation order only; bf16: torch multiplies
    x rounded to bf16, the core widens the weights, so the bf16 tolerance applies)."""
    if llmcore.linear_isa() == "scalar":
        pytest.skip("no packed path without AVX2: nothing to route")
    core = load_model(tiny_dir, dtype=dtype).model
    routed = load_model(tiny_dir, dtype=dtype).model
    table = routed.route_linears(force="torch")
    assert table is not None and {r.kernel for r in table.routes} == {"torch"}
    # qkv, o, gate/up, down and the untied LM head: five shapes, four buckets each.
    assert len({(r.n, r.k) for r in table.routes}) == 5 and len(table.routes) == 20
    assert routed.route_linears() is table  # measured once per model
    gen = torch.Generator().manual_seed(4)
    tol = 1e-4 if dtype == "float32" else 0.05
    for rows in (1, 5, 40, 200):
        ids = [int(i) for i in torch.randint(0, 320, (rows,), generator=gen)]
        want, got = _logits(core, ids), _logits(routed, ids)
        err = float((got - want).abs().max())
        # Measured: fp32 at most 7e-7, bf16 at most 0.014 (logits' spread ~1).
        assert err < tol, (dtype, rows, err)
        assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.95
    # A reload of the same weights (sleep/wake, weight updates) takes the table as it is:
    # the same routes, so the same bits.
    again = load_model(tiny_dir, dtype=dtype).model
    assert again.route_linears(table=table) is table
    torch.testing.assert_close(_logits(again, ids), got, rtol=0, atol=0)


def test_measured_table(tiny_dir: Path) -> None:
    """Real timing within a small budget: every (shape, bucket) has a route, the measured
    ones with both medians, the choice the faster by the margin."""
    model = load_model(tiny_dir, dtype="float32").model
    if llmcore.linear_isa() == "scalar":
        assert model.route_linears() is None
        return
    table = model.route_linears(budget_s=0.5)
    assert table is not None and table.elapsed_s < 2.0 and len(table.routes) == 20
    measured = [r for r in table.routes if r.core_us is not None]
    assert measured, table.summary()
    for r in measured:
        assert r.torch_us is not None and r.torch_us > 0 and r.core_us > 0
        assert r.kernel in _choices(r, "torch"), r
    d = table.as_dict()
    assert d["buckets"] == [1, 8, 64, 256] and len(d["routes"]) == 20
    assert "[64x64] float32" in table.summary()


def _choices(r: Any, other: str) -> set[str]:
    """The kernels the margin rule allows for route r, from its timings as the table rounds
    them (to 0.1 us): both, where the rounding could have moved the times across the rule."""
    edge = abs(r.torch_us - linear_routing.MARGIN * r.core_us) <= 0.1
    if edge:
        return {"core", other}
    return {other} if r.torch_us < linear_routing.MARGIN * r.core_us else {"core"}


def _packed_matrices(model: Any) -> list[llmcore.PackedWeight]:
    return [*model.native_plan(1).matrices(), model._logits_matrix()]


def test_quantized_entries_race_the_bf16_copy(tiny_dir: Path) -> None:
    """A quantized model's table: every bucket but M = 1 races the quantized kernel against
    a bf16 copy of the matrix, on any CPU with the packed path: the core's bf16 kernel on it
    ("core_bf16"), or where bf16 is native whichever of that and torch's bf16 GEMM ("torch")
    won the shape's largest bucket, one of the two per shape; M = 1 (a single sequence's
    decode, memory bound: the copy reads 2-3.5x the bytes) stays on the quantized kernel,
    untimed; the larger budget applies by default."""
    if llmcore.linear_isa() == "scalar":
        pytest.skip("no packed path without AVX2: nothing to route")
    mats = _packed_matrices(load_model(tiny_dir, quantization="int8").model)
    assert {w.dtype for w in mats} == {"q8_0"}
    for fast_bf16 in (False, True):
        raced = linear_routing.measure(mats, budget_s=5.0, fast_bf16=fast_bf16)
        assert raced.budget_s == 5.0 and len(raced.routes) == 20
        copies: dict[tuple[int, int], set[str]] = {}
        for r in raced.routes:
            if r.m == 1:
                assert r.kernel == "core" and r.core_us is None and r.torch_us is None, r
                continue
            assert r.core_us is not None and r.torch_us is not None, raced.summary()
            allowed = {"core_bf16", "torch"} if fast_bf16 else {"core_bf16"}
            other = {r.kernel} - {"core"} or allowed
            assert other <= allowed, r
            assert any(r.kernel in _choices(r, o) for o in other), r
            if r.kernel != "core":
                copies.setdefault((r.n, r.k), set()).add(r.kernel)
        assert all(len(kinds) == 1 for kinds in copies.values()), raced.summary()
    assert linear_routing.measure(mats[:1]).budget_s == linear_routing.QUANT_BUDGET_S


def test_quantized_matrices_routed_to_bf16_compute_the_bf16_product(tiny_dir: Path) -> None:
    """Every Q8_0 matrix forced to its bf16 copy (core_bf16): the logits stay within the
    bf16 path's tolerance of the core's quantized kernels."""
    if llmcore.linear_isa() == "scalar":
        pytest.skip("no packed path without AVX2: nothing to route")
    core = load_model(tiny_dir, quantization="int8").model
    routed = load_model(tiny_dir, quantization="int8").model
    table = routed.route_linears(force="torch")
    assert table is not None and {r.kernel for r in table.routes} == {"core_bf16"}
    assert {r.weight_format for r in table.routes} == {"q8_0"}
    gen = torch.Generator().manual_seed(5)
    for rows in (1, 5, 40, 200):
        ids = [int(i) for i in torch.randint(0, 320, (rows,), generator=gen)]
        want, got = _logits(core, ids), _logits(routed, ids)
        err = float((got - want).abs().max())
        assert err < 0.05, (rows, err)
        assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.95


def test_quantized_matrices_on_a_torch_copy_compute_the_bf16_product(tiny_dir: Path) -> None:
    """A quantized matrix's dense bf16 copy through torch's GEMM (the copy a shape gets where
    torch's bf16 beats the core's, e.g. AMX): the same product as the core_bf16 copy, to
    bf16 rounding."""
    if llmcore.linear_isa() == "scalar":
        pytest.skip("no packed path without AVX2: nothing to route")
    w = _packed_matrices(load_model(tiny_dir, quantization="int8").model)[0]
    n, k = w.shape
    x = torch.randn(37, k, generator=torch.Generator().manual_seed(2))
    packed_copy = linear_routing.alternative(w, "core_bf16")
    dense_copy = linear_routing.alternative(w, "torch")
    assert isinstance(packed_copy, llmcore.PackedWeight) and dense_copy.dtype == torch.bfloat16
    a = linear_routing.apply("core_bf16", x, packed_copy, None, torch.empty(37, n))
    b = linear_routing.apply("torch", x, dense_copy, None, torch.empty(37, n))
    torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


def test_flag() -> None:
    from server.cli import parse_args

    default = parse_args([]).engine
    assert default.linear_routing is True and default.batch_invariant is True
    assert parse_args(["--linear-routing", "off"]).engine.linear_routing is False
    assert parse_args(["--no-batch-invariant"]).engine.batch_invariant is False
    with pytest.raises(SystemExit):
        parse_args(["--linear-routing", "maybe"])
