"""Model loading: a Hugging Face directory or a GGUF file -> our torch model.

    load_model(None)              the default model (SmolLM2-135M-Instruct GGUF)
    load_model("dir/")            config.json + safetensors
    load_model("x.gguf")          converted once into the cache, then loaded as a directory
    load_model("x.gguf", quantization="gguf")   the same, linear matrices kept quantized
    load_model("dir/", quantization="int8")     linear matrices quantized to Q8_0 at load
    load_model("gemma-3-270m")    a named GGUF (default_model.GGUF_MODELS), assembled from
                                  its packages, then as any .gguf file
    load_model("whisper-base")    a named Whisper model (loader/whisper.py), or a
                                  CTranslate2 Whisper directory: prepared once into the cache

The returned ``model_dir`` is always a Hugging Face-style directory with the tokenizer
files (and chat template), so the tokenizer is loaded the same way for both sources.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actors.loader.default_model import (
    GGUF_MODELS,
    INSTALL_HINT,
    NAMED_MODELS,
    DefaultModelMissing,
    default_model_path,
    named_gguf_path,
)
from actors.loader.dtype import DTYPE_CHOICES, resolve_dtype

if TYPE_CHECKING:
    import torch

    from actors.models.config import ModelConfig
    from actors.models.llama import LlamaForCausalLM

__all__ = [
    "DTYPE_CHOICES",
    "INSTALL_HINT",
    "DefaultModelMissing",
    "GGUF_MODELS",
    "LoadedModel",
    "NAMED_MODELS",
    "QUANTIZATION_CHOICES",
    "default_model_path",
    "load_model",
    "prepare_model_dir",
    "resolve_dtype",
]


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: LlamaForCausalLM
    config: ModelConfig
    dtype: torch.dtype
    model_dir: Path  # HF-style: config.json, tokenizer files, generation_config.json
    source: Path  # what the caller named (a directory or a .gguf file)
    cache_hit: bool | None  # None for a plain directory; else whether conversion was skipped


def prepare_model_dir(source: str | Path | None) -> tuple[Path, Path, bool | None]:
    """Returns (source, HF-style directory, cache hit) without building the model."""
    from actors.loader.progress import stage

    from actors.loader import whisper

    if isinstance(source, str) and source in whisper.WHISPER_MODELS:
        dirs = whisper.resolve_named(source)
        with stage(f"preparing {source}"):
            entry, hit = whisper.prepare_ct2(dirs)
        return dirs[0], entry, hit
    if isinstance(source, str) and source in GGUF_MODELS and not Path(source).exists():
        with stage(f"locating {source} (assembled from its packages once)"):
            src = named_gguf_path(source)
    else:
        src = default_model_path() if source is None else Path(source).expanduser()
    if not src.exists():
        raise FileNotFoundError(f"model path {src} does not exist")
    if src.is_dir() and whisper.is_ct2_whisper_dir(src):
        with stage(f"preparing {src.name}"):
            entry, hit = whisper.prepare_ct2([src])
        return src, entry, hit
    if src.is_dir():
        return src, src, None
    if src.suffix != ".gguf":
        raise ValueError(f"{src} is neither a model directory nor a .gguf file")
    from actors.loader import cache
    from actors.loader.gguf import CONVERTER_VERSION, convert_gguf

    with stage(f"preparing {src.name}"):
        entry, hit = cache.get_or_create(src, CONVERTER_VERSION, lambda d: convert_gguf(src, d))
    return src, entry, hit


QUANTIZATION_CHOICES = ("gguf", "int8")


def load_model(
    source: str | Path | None = None, dtype: str = "auto", max_positions: int | None = None,
    pack: bool = True, quantization: str | None = None,
    hf_overrides: dict[str, Any] | None = None,
) -> LoadedModel:
    """quantization: None (the matrices in ``dtype``) or "gguf" (vLLM's name): a .gguf
    model's Q8_0/Q4_0/Q4_1 matrices stay in their blocks in the core (CPU only; the rest,
    norms included, comes in ``dtype`` as usual); "int8": any model's linear matrices are
    quantized from their float32 values into Q8_0 blocks (loader/int8.py); the rest stays
    float32 and ``dtype`` sets only the KV cache's default. ``hf_overrides``: keys merged
    over config.json (--hf-overrides)."""
    from actors.loader.hf import load_hf_dir

    if quantization not in (None, *QUANTIZATION_CHOICES):
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_CHOICES)}, "
                         f"got {quantization!r}")
    src, model_dir, hit = prepare_model_dir(source)
    if quantization == "gguf" and src.suffix != ".gguf":
        raise ValueError(f"--quantization gguf needs a .gguf model, got {src}")
    torch_dtype = resolve_dtype(dtype)
    if dtype == "auto" and _is_whisper(model_dir):
        # Whisper's checkpoints are small (39-74 M parameters) and its greedy transcripts
        # lost words with bf16 weights (tiny.en) where float32 equals faster-whisper's tokens.
        torch_dtype = resolve_dtype("float32")
    if quantization == "int8":
        from actors.loader.int8 import int8_weights
        from actors.loader.progress import log, stage

        model, cfg = load_hf_dir(model_dir, resolve_dtype("float32"), max_positions, pack=False,
                                 hf_overrides=hf_overrides)
        with stage(f"quantizing the matrices of {src.name} to int8 (Q8_0)"):
            model.pack_weights(int8_weights(model))
        log.info("weights: %s", model.weight_formats())
        return LoadedModel(model, cfg, torch_dtype, model_dir, src, hit)
    model, cfg = load_hf_dir(model_dir, torch_dtype, max_positions,
                             pack=pack and quantization is None, hf_overrides=hf_overrides)
    if quantization == "gguf":
        import json

        from actors.loader.gguf import quantized_weights
        from actors.loader.progress import log, stage

        with stage(f"packing the quantized matrices of {src.name}"):
            hf_cfg = json.loads((model_dir / "config.json").read_text())
            model.pack_weights(quantized_weights(src, hf_cfg))
        log.info("weights: %s", model.weight_formats())
    return LoadedModel(model, cfg, torch_dtype, model_dir, src, hit)


def _is_whisper(model_dir: Path) -> bool:
    import json

    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == "whisper"
