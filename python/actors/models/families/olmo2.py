"""OLMo 2: norms after attention and after the MLP (none before), and RMSNorm over the
whole q and k projections (not per head) before RoPE."""

from __future__ import annotations

from typing import Any

from actors.models.arch import DecoderOptions
from actors.models.families import Family


def _options(hf: dict[str, Any], num_layers: int) -> tuple[DecoderOptions, dict[str, Any]]:
    return DecoderOptions(norm_layout="post", qk_norm="full"), {}


FAMILIES = (Family(("olmo2",), _options),)
