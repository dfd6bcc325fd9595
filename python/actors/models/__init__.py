"""Model code: the Llama family in torch over a flattened batch.

``ModelConfig`` imports without torch; the torch-backed names load on first access.
"""

from __future__ import annotations

from typing import Any

from actors.models.config import ModelConfig, UnsupportedModelError

_LAZY = {
    "LlamaForCausalLM": "actors.models.llama",
    "AttentionBackend": "actors.models.attention",
    "DenseCausalAttention": "actors.models.attention",
    "LayerAttentionSpec": "actors.models.attention",
    "build_model": "actors.models.registry",
    "pool": "actors.models.pooling",
}

__all__ = ["ModelConfig", "UnsupportedModelError", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'actors.models' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
