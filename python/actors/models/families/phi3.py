"""Phi-3 / Phi-4-mini: Llama-shaped, with q/k/v and gate/up stored fused in the checkpoint
(our fused parameters' own names: they load with no mapping)."""

from __future__ import annotations

from typing import Any

from actors.models.arch import DecoderOptions
from actors.models.families import Family


def _options(hf: dict[str, Any], num_layers: int) -> tuple[DecoderOptions, dict[str, Any]]:
    return DecoderOptions(), {}


FAMILIES = (Family(("phi3",), _options),)
