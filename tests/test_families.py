"""Every decoder family against transformers: tiny random checkpoints built with
transformers' own config classes, loaded by our HF loader, logits held to transformers' in
fp32 on the fused CPU path and on the module path, greedy choices equal."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from actors.loader import load_model
from test_models import load_reference, run_ours, run_transformers, tiny_prompts

# model_type -> config overrides that make each family's options bite: head_dim 16 (the
# families' defaults are 128-256), windows shorter than the prompts, soft-caps small enough
# to bend the logits, multipliers away from 1, sparse and dense layers mixed.
FAMILY_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "gemma3": ("gemma3_text", {
        "head_dim": 16, "sliding_window": 6, "query_pre_attn_scalar": 24,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                            "full_attention": {"rope_type": "default", "rope_theta": 1e6}}}),
    "gemma3-linear-rope": ("gemma3_text", {
        "head_dim": 16, "sliding_window": 6,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}}),
    "gemma2": ("gemma2", {"head_dim": 16, "sliding_window": 6, "query_pre_attn_scalar": 24,
                          "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0}),
    "qwen3": ("qwen3", {"head_dim": 16}),
    "phi3": ("phi3", {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}),
    "granite": ("granite", {"embedding_multiplier": 3.0, "residual_multiplier": 0.4,
                            "attention_multiplier": 0.2, "logits_scaling": 2.5}),
    "olmo2": ("olmo2", {"pad_token_id": 0, "eos_token_id": 1}),
    "qwen3_moe": ("qwen3_moe", {"head_dim": 16, "num_experts": 6, "num_experts_per_tok": 2,
                                "moe_intermediate_size": 32, "mlp_only_layers": [1],
                                "norm_topk_prob": True}),
    "qwen3_moe-unnormalised": ("qwen3_moe", {"head_dim": 16, "num_experts": 4,
                                             "num_experts_per_tok": 3,
                                             "moe_intermediate_size": 24}),
    "mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),
}


def _check(case: str, make_tiny_model: Callable[..., Path], native: bool) -> None:
    kind, overrides = FAMILY_CASES[case]
    model_dir = make_tiny_model(kind, **overrides)
    loaded = load_model(model_dir, dtype="float32")
    model = loaded.model
    model.native = native
    ref = load_reference(model_dir)
    prompts = tiny_prompts(loaded.config.vocab_size)
    worst = 0.0
    for prompt, got in zip(prompts, run_ours(model, prompts)):
        want = run_transformers(ref, prompt)
        worst = max(worst, (got - want).abs().max().item())
        assert want.abs().max().item() > 0.3  # logits large enough for the check to bite
        assert torch.equal(got.argmax(-1), want.argmax(-1)), case
    print(f"{case} ({'native' if native else 'module'}): max |diff| {worst:.2e}")
    assert worst <= 1e-4, worst


@pytest.mark.parametrize("case", list(FAMILY_CASES))
def test_family_matches_transformers_native(case: str,
                                            make_tiny_model: Callable[..., Path]) -> None:
    _check(case, make_tiny_model, native=True)


@pytest.mark.parametrize("case", ["gemma3", "gemma2", "olmo2", "granite", "qwen3_moe"])
def test_family_matches_transformers_module_path(case: str,
                                                 make_tiny_model: Callable[..., Path]) -> None:
    _check(case, make_tiny_model, native=False)


def test_family_options_reach_the_config(make_tiny_model: Callable[..., Path]) -> None:
    from actors.models import ModelConfig

    def cfg(case: str) -> Any:
        kind, overrides = FAMILY_CASES[case]
        return ModelConfig.from_dir(make_tiny_model(kind, **overrides))

    g3 = cfg("gemma3")
    assert g3.sliding_windows == (6, None, 6)
    assert [t for t, _ in g3.arch.layer_rope] == [100.0, 1e6, 100.0]
    assert g3.arch.norm_layout == "sandwich" and g3.arch.qk_norm == "head"
    assert g3.arch.attn_scale == pytest.approx(24 ** -0.5)
    g2 = cfg("gemma2")
    assert (g2.arch.attn_softcap, g2.arch.final_softcap) == (2.0, 3.0)
    moe = cfg("qwen3_moe").arch.moe
    assert moe is not None and moe.layers == (True, False, True) and moe.top_k == 2
    assert cfg("olmo2").arch.norm_layout == "post"


def test_multimodal_gemma3_serves_its_text_model(tmp_path: Path) -> None:
    """A Gemma 3 checkpoint with a vision tower (model_type gemma3, 4B and up): its text
    model's logits equal transformers' on text input; the vision tensors are skipped."""
    import transformers

    from conftest import _randomize_

    text = {**FAMILY_CASES["gemma3"][1], "vocab_size": 320, "hidden_size": 64,
            "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 512}
    vision = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
              "num_attention_heads": 2, "image_size": 28, "patch_size": 14}
    cfg = transformers.Gemma3Config(text_config=text, vision_config=vision,
                                    mm_tokens_per_image=4)
    ref = transformers.Gemma3ForConditionalGeneration(cfg).float().eval()
    _randomize_(ref, seed=99)
    ref.save_pretrained(tmp_path)
    loaded = load_model(tmp_path, dtype="float32")
    assert loaded.config.model_type == "gemma3_text"
    assert loaded.config.sliding_windows == (6, None, 6)
    prompts = tiny_prompts(loaded.config.vocab_size)
    worst = 0.0
    for prompt, got in zip(prompts, run_ours(loaded.model, prompts)):
        want = run_transformers(ref, prompt)
        worst = max(worst, (got - want).abs().max().item())
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    print(f"gemma3 multimodal, text: max |diff| {worst:.2e}")
    assert worst <= 1e-4, worst
