"""Llama and the families that differ from it only by flags: Mistral (sliding window),
Qwen2 (q/k/v bias, windows from max_window_layers)."""

from __future__ import annotations

from typing import Any

from actors.models.arch import DecoderOptions
from actors.models.families import Family


def _options(hf: dict[str, Any], num_layers: int) -> tuple[DecoderOptions, dict[str, Any]]:
    return DecoderOptions(), {}


FAMILIES = (Family(("llama", "mistral", "qwen2"), _options),)
