"""Qwen3: Qwen2 without the q/k/v bias, with a per-head RMSNorm on q and k before RoPE."""

from __future__ import annotations

from typing import Any

from actors.models.arch import DecoderOptions
from actors.models.families import Family


def _options(hf: dict[str, Any], num_layers: int) -> tuple[DecoderOptions, dict[str, Any]]:
    return DecoderOptions(qk_norm="head"), {"qkv_bias": bool(hf.get("attention_bias", False))}


FAMILIES = (Family(("qwen3",), _options),)
