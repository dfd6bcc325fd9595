"""Loading a Hugging Face model directory: config.json + *.safetensors (one file, or shards
listed in model.safetensors.index.json), or else pytorch_model.bin (older encoders ship
only that; read with ``weights_only=True``, so no pickled code runs)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from actors.loader.progress import ProgressBar, stage
from actors.models.config import ModelConfig
from actors.models.llama import LlamaForCausalLM
from actors.models.registry import build_model

INDEX_FILE = "model.safetensors.index.json"
PYTORCH_FILE = "pytorch_model.bin"


def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [model_dir / f for f in sorted(set(weight_map.values()))]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files and (model_dir / PYTORCH_FILE).is_file():
        return [model_dir / PYTORCH_FILE]
    if not files:
        raise FileNotFoundError(f"no *.safetensors or {PYTORCH_FILE} in {model_dir}")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"{INDEX_FILE} names missing shards: {', '.join(missing)}")
    return files


def iter_weights(files: list[Path], dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for f in files:
        if f.name == PYTORCH_FILE:
            state = torch.load(str(f), map_location="cpu", weights_only=True)
            for name, tensor in state.items():
                yield name, tensor.to(dtype)
            continue
        with safe_open(str(f), framework="pt") as st:
            keys = list(st.keys())
            bar = ProgressBar(f"loading {f.name}", len(keys))
            for name in keys:
                yield name, st.get_tensor(name).to(dtype)
                bar.advance()


def load_hf_dir(
    model_dir: Path, dtype: torch.dtype, max_positions: int | None = None, pack: bool = True
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """pack: move the matrices into the core's packed layout (the fast CPU path); off
    leaves plain torch parameters (tests that edit weights after loading)."""
    cfg = ModelConfig.from_dir(model_dir)
    # A prepared CTranslate2 Whisper entry (loader/whisper.py) keeps its model.bin.
    ct2 = cfg.model_type == "whisper" and (model_dir / "model.bin").is_file()
    files = [model_dir / "model.bin"] if ct2 else safetensors_files(model_dir)
    with stage(f"building {cfg.model_type} model ({cfg.num_layers} layers, {dtype})"):
        model = build_model(cfg, dtype=dtype, max_positions=max_positions)
    with stage(f"loading weights from {len(files)} file(s)"):
        # The model's own weight dtype: an encoder keeps float32 under a bf16 default.
        if ct2:
            from actors.loader.whisper import ct2_weights

            model.load_weights(ct2_weights(model_dir, model.dtype))
        else:
            model.load_weights(iter_weights(files, model.dtype))
    if pack:
        model.pack_weights()
    return model, cfg
