"""transformers as the correctness oracle for the default GGUF model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from actors.loader.reference import transformers_reference


def gguf_reference(path: Path) -> Any:
    return transformers_reference(path)
