"""The decoder families: model_type -> how its Hugging Face config maps onto the shared
decoder (``DecoderOptions``) and how its checkpoint names map onto our modules.

Adding a dense family is one file here: a ``Family`` with its config mapping (the fields
that differ from Llama's) and any checkpoint names that differ from transformers' Llama
names. Plain data and functions, no torch: the config is read without the model code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from actors.models.arch import DecoderOptions


@dataclass(frozen=True, slots=True)
class Family:
    model_types: tuple[str, ...]
    # hf config -> the options, and overrides of the common fields (qkv_bias, windows...)
    options: Callable[[dict[str, Any], int], tuple[DecoderOptions, dict[str, Any]]]
    # checkpoint name fragments -> ours, applied before the fused-projection mapping
    renames: tuple[tuple[str, str], ...] = ()
    # checkpoint tensors this engine does not run (a multimodal checkpoint's vision tower)
    skips: tuple[str, ...] = ()
    activations: tuple[str, ...] = ("silu",)


def _registry() -> dict[str, Family]:
    from actors.models.families import gemma, granite, llama, moe, olmo2, phi3, qwen3

    out: dict[str, Family] = {}
    for module in (llama, qwen3, gemma, phi3, granite, olmo2, moe):
        for fam in module.FAMILIES:
            for t in fam.model_types:
                out[t] = fam
    return out


FAMILIES = _registry()
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)


def family(model_type: str) -> Family | None:
    return FAMILIES.get(model_type)
