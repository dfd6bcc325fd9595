"""transformers as the correctness oracle for the default GGUF model."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from actors.loader.reference import transformers_reference


@functools.lru_cache(maxsize=2)
def _reference(path: str) -> Any:
    return transformers_reference(path)


def gguf_reference(path: Path) -> Any:
    """The transformers model of a GGUF file, built once per test process: its config
    parse, random init and de-quantization take 20-60 s here, and five modules use it.
    Callers must not change it (adapters are merged into a deep copy)."""
    return _reference(str(path))
