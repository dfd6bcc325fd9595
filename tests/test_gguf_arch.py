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
from actors.models.config import UnsupportedModelError
from gguf_export import export_gguf

SIZES = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
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
