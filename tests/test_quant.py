"""GGUF weights kept quantized (``--quantization gguf``): the core's kernels against a float64
dequantize-then-matmul reference on every instruction set this CPU runs, and the default
model's logits and greedy outputs against the fp32 path of the same (dequantized) weights,
beside today's bf16 copy, so the two are compared on one text in one run."""

from __future__ import annotations

from typing import Any

import llmcore
import numpy as np
import pytest
import torch

from actors import LLM, SamplingParams
from actors.loader import load_model
from actors.loader.dtype import resolve_quantization
from accuracy_helpers import accuracy, logits_of

gguf = pytest.importorskip("gguf")

TYPES = {"q8_0": 8, "q4_0": 2, "q4_1": 3}
ISAS = ("scalar", "avx2", "avx512", "amx")
MiB = 1 << 20


def _blocks(name: str, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(GGUF blocks of w, w as those blocks dequantize, float64)."""
    t = gguf.GGMLQuantizationType(TYPES[name])
    q = gguf.quants.quantize(w.astype(np.float32), t)
    return q, gguf.quants.dequantize(q, t).astype(np.float64)


def _rounding_bound(w: np.ndarray, x: np.ndarray, bits: int) -> np.ndarray:
    """|W| |x - round(x)| as the kernel rounds x (per 32-block, step max|x|/127 for int8,
    /32767 for int16): the most the rounded activations can move each output, elementwise."""
    m, k = x.shape
    amax = np.abs(x.reshape(m, k // 32, 32)).max(-1, keepdims=True)
    step = np.broadcast_to(amax / (2 ** (bits - 1) - 1), (m, k // 32, 32)).reshape(m, k)
    return (step / 2) @ np.abs(w).T


_NEEDS = {"avx512": "AVX512_VNNI", "amx": "AMX-INT8 tiles the kernel lets this process use"}


def _variant(isa: str) -> str:
    got = llmcore._C.set_linear_isa(isa)
    if got != isa:
        pytest.skip(f"this CPU lacks {isa} ({_NEEDS.get(isa, isa.upper())})"
                    f"; the linear kernels run {got} at most")
    return got


@pytest.fixture
def restore_isa() -> Any:
    before, bits = llmcore.linear_isa(), llmcore._C.quant_activation_bits()
    yield
    llmcore._C.set_linear_isa(before)
    llmcore._C.set_quant_activation_bits(bits)


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", sorted(TYPES))
@pytest.mark.parametrize("m", [1, 3, 8, 16, 37, 64])
def test_kernel_matches_float64_reference(qtype: str, isa: str, m: int, bits: int,
                                          restore_isa: Any, isa_record: Any) -> None:
    """Every variant against float64 and bit for bit against scalar; amx runs its tiles from
    16 rows on (below, the VNNI kernel)."""
    rng = np.random.default_rng(7)
    n, k = 200, 576
    raw, w = _blocks(qtype, rng.standard_normal((n, k)) * 0.05)
    packed = llmcore.PackedWeight.from_gguf(TYPES[qtype], raw, n, k)
    assert packed.dtype == qtype and packed.shape == (n, k) and packed.quant_type == TYPES[qtype]
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    _variant(isa)
    assert llmcore._C.set_quant_activation_bits(bits) == bits
    got = llmcore.linear(x, packed, bias, np.empty((m, n), np.float32)).astype(np.float64)
    ref = x.astype(np.float64) @ w.T + bias
    err = np.abs(got - ref)
    # fp32 accumulation: ~K ulps of the largest partial sum, on top of the rounding of x.
    bound = _rounding_bound(w, x.astype(np.float64), bits) + 1e-4
    assert (err <= bound).all(), f"worst {float((err / bound).max()):.2f} x the bound"
    # The rounding is real but small: relative to the outputs' spread, well under 1%
    # (int8), and int16's is far smaller still.
    assert float(err.max()) < (0.01 if bits == 8 else 2e-4) * float(np.abs(ref).max())
    llmcore._C.set_linear_isa("scalar")
    scalar = llmcore.linear(x, packed, bias, np.empty((m, n), np.float32))
    np.testing.assert_array_equal(got.astype(np.float32), scalar)  # same formula, same bits
    if isa == "amx" and m >= 16:
        isa_record.ran("linear", "amx")


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("qtype", sorted(TYPES))
def test_a_row_does_not_depend_on_the_rows_beside_it(qtype: str, bits: int,
                                                     restore_isa: Any) -> None:
    """Batch invariance of the quantized kernels on this CPU's widest variant: each row of
    products of 300, 64, 17 and 16 rows (the tile kernel where the CPU has AMX) equals the
    same row multiplied alone (the VNNI kernel), bit for bit; so does every row of a K and
    N that are not whole tiles' worth of panels."""
    rng = np.random.default_rng(11)
    for n, k in ((40, 96), (200, 576)):
        raw, _ = _blocks(qtype, rng.standard_normal((n, k)) * 0.05)
        packed = llmcore.PackedWeight.from_gguf(TYPES[qtype], raw, n, k)
        assert llmcore._C.set_quant_activation_bits(bits) == bits
        x = (rng.standard_normal((300, k)) * rng.uniform(0.1, 10, (300, 1))).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        alone = np.stack([llmcore.linear(x[i:i + 1], packed, bias, np.empty((1, n), np.float32))[0]
                          for i in range(300)])
        for m in (300, 64, 17, 16):
            got = llmcore.linear(x[:m], packed, bias, np.empty((m, n), np.float32))
            np.testing.assert_array_equal(got, alone[:m])
        # bf16 outputs: each row the same rounding of the same fp32 values
        xt = torch.from_numpy(x[:64])
        got16 = llmcore.linear(xt, packed, None, torch.empty((64, n), dtype=torch.bfloat16))
        for i in (0, 31, 63):
            one = llmcore.linear(xt[i:i + 1], packed, None, torch.empty((1, n), dtype=torch.bfloat16))
            assert torch.equal(one[0], got16[i])


@pytest.mark.parametrize("qtype", sorted(TYPES))
def test_rows_dequantize_exactly(qtype: str) -> None:
    rng = np.random.default_rng(3)
    raw, w = _blocks(qtype, rng.standard_normal((40, 64)))
    packed = llmcore.PackedWeight.from_gguf(TYPES[qtype], raw, 40, 64)
    ids = np.array([39, 0, 17], np.int64)
    out = packed.rows(ids, np.empty((3, 64), np.float32))
    np.testing.assert_array_equal(out, w[ids].astype(np.float32))


def test_engine_refuses_an_unknown_activation_width(default_model: tuple[Any, float]) -> None:
    loaded = default_model[0]
    with pytest.raises(ValueError, match="quantization_activations must be one of"):
        LLM(str(loaded.source), loaded=loaded, quantization_activations="int4")


def test_activation_width_is_8_or_16() -> None:
    assert llmcore._C.quant_activation_bits() == 16  # the default
    for bad in (0, 4, 12, 32, -16):
        with pytest.raises(ValueError, match="8 or 16"):
            llmcore._C.set_quant_activation_bits(bad)
    assert llmcore._C.quant_activation_bits() == 16


def test_bad_blocks_are_refused() -> None:
    with pytest.raises(ValueError, match="bytes"):
        llmcore.PackedWeight.from_gguf(8, np.zeros(33, np.uint8), 1, 32)
    with pytest.raises(ValueError, match="multiple of 32"):
        llmcore.PackedWeight.from_gguf(8, np.zeros(34, np.uint8), 1, 16)
    with pytest.raises(ValueError, match="unsupported quantization type"):
        llmcore.PackedWeight.from_gguf(10, np.zeros(84, np.uint8), 1, 256)  # Q2_K


# ---- the default model ---------------------------------------------------------------------

TEXT = ("The history of the lighthouse begins with fires lit on hilltops to guide ships. "
        "Later, towers of stone carried lamps and mirrors, and keepers lived beside them, "
        "trimming wicks through the night so that sailors could find the harbour.")


@pytest.fixture(scope="module")
def models(default_model: tuple[Any, float]) -> dict[str, Any]:
    src = default_model[0].source
    return {"fp32": default_model[0], "bf16": load_model(src, dtype="bfloat16"),
            "gguf": load_model(src, dtype="bfloat16", quantization="gguf")}


@pytest.mark.slow
def test_logits_against_fp32_of_the_same_weights(models: dict[str, Any]) -> None:
    """Every position of a fixed text: gguf (Q4_1/Q8_0 blocks) with int16 activations (the
    default) and with int8 ones, and bf16 (a copy of the dequantized weights, bf16
    activations in its kernel) against fp32 (the dequantized weights in fp32, fp32
    arithmetic)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(models["fp32"].model_dir))
    ids = tok.encode(TEXT, add_special_tokens=False)
    ref = logits_of(models["fp32"], ids)
    acc = {name: accuracy(logits_of(models[name], ids), ref) for name in ("bf16", "gguf")}
    before = llmcore._C.set_quant_activation_bits(8)
    try:
        acc["gguf_int8"] = accuracy(logits_of(models["gguf"], ids), ref)
    finally:
        llmcore._C.set_quant_activation_bits(before)
    print(f"logits vs fp32 over {len(ids)} positions ({llmcore.linear_isa()}): {acc}")
    # Measured (AVX-512 and AVX2 give the same bits): bf16 max 0.15-0.25, top-1 1.0; gguf
    # with int16 activations 0.006, 1.0; with int8 ones 1.03, 0.978 (an error relative to
    # each block's largest |x|). The bounds catch a broken format or row order (top-1 near
    # 0) and a drift well past the measured figures; int16 must beat the bf16 copy.
    assert acc["bf16"]["top1"] >= 0.98 and acc["bf16"]["max_abs"] < 0.5, acc
    assert acc["gguf"]["top1"] >= 0.98 and acc["gguf"]["max_abs"] < 0.05, acc
    assert acc["gguf"]["max_abs"] < acc["bf16"]["max_abs"], acc
    assert acc["gguf_int8"]["top1"] >= 0.95 and acc["gguf_int8"]["max_abs"] < 2.0, acc


@pytest.mark.slow
def test_model_keeps_gguf_formats(models: dict[str, Any]) -> None:
    formats = models["gguf"].model.weight_formats()
    # SmolLM2-135M Q4_1: 30 layers x (qkv, o, gate_up, down) in Q4_1, the tied embedding Q8_0.
    assert formats == {"q4_1": 120, "q8_0": 1}, formats


@pytest.mark.slow
def test_greedy_outputs_against_fp32(models: dict[str, Any]) -> None:
    """The engine tests' prompts (plain and behind the shared system prompt), 16 greedy
    tokens, against the fp32 engine on the same weights. bf16 and gguf (int16 activations)
    must follow fp32 until a near-tie (fp32's two best logprobs within 0.05, test_isa_parity's
    rule); gguf with int8 activations moves logits further (test above), so it is held to
    measured bounds instead: at most 7 of 10 prompts diverging (5 measured), none where fp32
    was sure (gap >= 0.5)."""
    from test_engine import PROMPTS, SYSTEM

    def runs(loaded: Any, **engine: Any) -> list[tuple[list[int], list[float]]]:
        llm = LLM(str(loaded.source), loaded=loaded, kv_cache_memory=128 * MiB,
                  max_model_len=2048, **engine)
        prompts = [llm.tokenizer.encode(t, add_special_tokens=False)
                   for t in PROMPTS + [SYSTEM + " " + p for p in PROMPTS]]
        params = SamplingParams(temperature=0.0, max_tokens=16, logprobs=2, ignore_eos=True)
        out = []
        for o in (r.outputs[0] for r in llm.generate(prompts, params)):
            out.append((list(o.token_ids),
                        [lp.top_logprobs[0] - lp.top_logprobs[1] for lp in o.logprobs]))
        return out

    def divergences(got: list[tuple[list[int], list[float]]]) -> list[tuple[int, int, float]]:
        found = []
        for p, ((w_tokens, w_gaps), (g_tokens, _)) in enumerate(zip(want, got)):
            first = next((i for i, (a, b) in enumerate(zip(w_tokens, g_tokens)) if a != b), None)
            if first is not None:
                found.append((p, first, round(w_gaps[first], 4)))
        return found

    want = runs(models["fp32"])
    div = {name: divergences(runs(models[name])) for name in ("bf16", "gguf")}
    before = llmcore._C.quant_activation_bits()
    try:  # LLM() sets the width from its config: int8 here
        div["gguf_int8"] = divergences(runs(models["gguf"], quantization_activations="int8"))
    finally:
        llmcore._C.set_quant_activation_bits(before)
    print(f"greedy vs fp32 over {len(want)} prompts, (prompt, first differing token, fp32 "
          f"gap there): {div}")
    assert all(gap < 0.05 for _, _, gap in div["bf16"]), div["bf16"]
    assert all(gap < 0.05 for _, _, gap in div["gguf"]), div["gguf"]
    assert len(div["gguf_int8"]) <= 7, div["gguf_int8"]  # measured: 5 of 10
    assert all(gap < 0.5 for _, _, gap in div["gguf_int8"]), div["gguf_int8"]


def test_flag_reaches_the_engine_config() -> None:
    from server.cli import parse_args

    assert parse_args(["--quantization", "gguf"]).engine.quantization == "gguf"
    assert parse_args(["-q", "gguf"]).engine.quantization == "gguf"
    # The default model is a GGUF: kept in its blocks wherever its weights would be bf16.
    assert parse_args([]).engine.quantization == resolve_quantization("auto", None, "auto")
    assert parse_args(["-q", "none"]).engine.quantization is None
    assert parse_args(["--dtype", "float32"]).engine.quantization is None
    with pytest.raises(SystemExit):
        parse_args(["--quantization", "awq"])
    assert parse_args([]).engine.quantization_activations == "int16"
    assert parse_args(["--quantization-activations", "int8"]).engine.quantization_activations \
        == "int8"
    with pytest.raises(SystemExit):
        parse_args(["--quantization-activations", "int4"])


def test_auto_quantization_keeps_gguf_blocks_where_weights_would_be_bf16() -> None:
    avx2, bf16, bare = frozenset({"avx2", "fma"}), frozenset({"avx512_bf16"}), frozenset()
    # the default model (None) and any .gguf file
    assert resolve_quantization("auto", None, "auto", avx2) == "gguf"
    assert resolve_quantization("auto", "/m/x.gguf", "auto", bf16) == "gguf"
    assert resolve_quantization("auto", "/m/x.gguf", "bfloat16", bare) == "gguf"
    # float32 is the exact mode: explicit, or what "auto" means on a CPU without AVX2 + FMA
    assert resolve_quantization("auto", None, "float32", bf16) is None
    assert resolve_quantization("auto", None, "auto", bare) is None
    # a Hugging Face directory has no blocks to keep
    assert resolve_quantization("auto", "/m/dir", "auto", bf16) is None
    # explicit choices pass through; "none" is None
    assert resolve_quantization("none", None, "auto", bf16) is None
    assert resolve_quantization(None, None, "auto", bf16) is None
    assert resolve_quantization("int8", "/m/dir", "auto", bare) == "int8"
    assert resolve_quantization("gguf", None, "float32", bare) == "gguf"


def test_gguf_quantization_needs_a_gguf_file(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="needs a .gguf model"):
        load_model(tmp_path, quantization="gguf")
    with pytest.raises(ValueError, match="quantization must be one of"):
        load_model(tmp_path, quantization="int4")


@pytest.mark.slow
def test_server_serves_the_quantized_model() -> None:
    """`python -m server --quantization gguf`: the real server on the quantized weights,
    through the openai SDK; its greedy text is the offline quantized engine's."""
    from openai import OpenAI

    from server_helpers import ServerProcess

    srv = ServerProcess("--quantization", "gguf").wait_ready()
    try:
        with OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0) as client:
            got = client.completions.create(model="SmolLM2-135M-Instruct",
                                            prompt="The capital of France is",
                                            max_tokens=12, temperature=0)
            want = LLM(quantization="gguf", kv_cache_memory=64 * MiB, max_model_len=512)
            ids = want.tokenizer.encode("The capital of France is", add_special_tokens=False)
            text = want.generate([ids], SamplingParams(temperature=0, max_tokens=12))
            assert got.choices[0].text == text[0].outputs[0].text
            assert got.usage.completion_tokens == 12
    finally:
        assert srv.stop() == 0, srv.log()
