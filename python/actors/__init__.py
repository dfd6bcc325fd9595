"""actors: the engine side of the server (scheduler, KV manager, runner, models, loader).

Importing this package must stay cheap: no torch, no transformers. Heavy modules
(``actors.models``, ``actors.loader``, ``actors.llm``) load on first use, so
``from actors import LLM, SamplingParams`` works without paying for them up front.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LLM", "EngineConfig", "LLMEngine", "SamplingParams"]

_LAZY = {
    "LLM": "actors.llm",
    "EngineConfig": "actors.config",
    "LLMEngine": "actors.core.engine",
    "SamplingParams": "actors.params.sampling",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'actors' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
