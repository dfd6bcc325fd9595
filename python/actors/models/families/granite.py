"""Granite (3.x): Llama with four multipliers: embeddings, the residual branches, the
softmax scale and the logits (divided by logits_scaling)."""

from __future__ import annotations

from typing import Any

from actors.models.arch import DecoderOptions
from actors.models.families import Family


def _options(hf: dict[str, Any], num_layers: int) -> tuple[DecoderOptions, dict[str, Any]]:
    opts = DecoderOptions(
        embed_scale=float(hf.get("embedding_multiplier", 1.0)),
        residual_scale=float(hf.get("residual_multiplier", 1.0)),
        attn_scale=float(hf.get("attention_multiplier", 1.0)),
        logits_scale=1.0 / float(hf.get("logits_scaling", 1.0)),
    )
    return opts, {}


FAMILIES = (Family(("granite",), _options),)
