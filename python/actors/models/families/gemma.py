"""Gemma 2 and Gemma 3 (text): sandwich norms scaled by (1 + w), GELU-tanh gated MLP,
embeddings times sqrt(hidden), softmax scale query_pre_attn_scalar ** -0.5, sliding-window
layers (Gemma 2: every other one; Gemma 3: five of six, with their own RoPE base).
Gemma 2 soft-caps the attention logits and the final logits; Gemma 3 normalises q and k
per head instead."""

from __future__ import annotations

from typing import Any

from actors.models.arch import DecoderOptions
from actors.models.families import Family


def _common(hf: dict[str, Any]) -> dict[str, Any]:
    head_dim = int(hf.get("head_dim") or 256)
    scalar = hf.get("query_pre_attn_scalar") or head_dim
    return dict(norm_layout="sandwich", norm_offset=1.0, act="gelu_tanh",
                embed_scale=float(hf["hidden_size"]) ** 0.5,
                attn_scale=float(scalar) ** -0.5)


def _overrides(hf: dict[str, Any]) -> dict[str, Any]:
    return {"qkv_bias": bool(hf.get("attention_bias", False)),
            "tie_word_embeddings": bool(hf.get("tie_word_embeddings", True))}


def _gemma2(hf: dict[str, Any], num_layers: int) -> tuple[DecoderOptions, dict[str, Any]]:
    opts = DecoderOptions(**_common(hf), attn_softcap=_cap(hf, "attn_logit_softcapping"),
                          final_softcap=_cap(hf, "final_logit_softcapping"))
    return opts, _overrides(hf)


def _gemma3(hf: dict[str, Any], num_layers: int) -> tuple[DecoderOptions, dict[str, Any]]:
    from actors.models.config import layer_kinds, rope_of

    params = hf.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        # transformers >= 5: one rope entry per layer kind
        ropes = {kind: rope_of({"rope_parameters": p}) for kind, p in params.items()}
    else:
        ropes = {"full_attention": rope_of(hf),
                 "sliding_attention": (float(hf.get("rope_local_base_freq", 10000.0)), None)}
    kinds = layer_kinds(hf, num_layers)
    layer_rope = tuple(ropes.get(k, ropes["full_attention"]) for k in kinds)
    opts = DecoderOptions(**_common(hf), qk_norm="head",
                          attn_softcap=_cap(hf, "attn_logit_softcapping"),
                          final_softcap=_cap(hf, "final_logit_softcapping"),
                          layer_rope=layer_rope)
    return opts, _overrides(hf)


def _cap(hf: dict[str, Any], key: str) -> float | None:
    v = hf.get(key)
    return float(v) if v else None


FAMILIES = (
    Family(("gemma2",), _gemma2, activations=("gelu_pytorch_tanh", "gelu_tanh")),
    # A multimodal Gemma 3 checkpoint (model_type gemma3: 4B and up) serves its text model:
    # config.py reads its text_config; its language model's tensors come under these
    # prefixes (transformers < 5 and >= 5 spell them differently), the vision tower's are
    # skipped.
    Family(("gemma3_text",), _gemma3, activations=("gelu_pytorch_tanh", "gelu_tanh"),
           renames=(("language_model.model.", "model."), ("model.language_model.", "model."),
                    ("language_model.lm_head.", "lm_head.")),
           skips=("vision_tower.", "multi_modal_projector.")),
)
