"""Loading a Hugging Face model directory: config.json + *.safetensors (one file, or shards
listed in model.safetensors.index.json), or else pytorch_model.bin (older encoders ship
only that; read with ``weights_only=True``, so no pickled code runs)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from actors.loader.progress import ProgressBar, stage
from actors.models.classifier import ClassifierHead
from actors.models.config import ModelConfig, UnsupportedModelError
from actors.models.llama import LlamaForCausalLM
from actors.models.registry import build_model
from actors.params.classify import classifier_of, hf_config_of

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


def _classifier_head(model_dir: Path, cfg: ModelConfig,
                     overrides: dict[str, Any] | None) -> ClassifierHead | None:
    """The classification head a sequence classifier's config describes (None for any
    other model), its label tokens' ids read from the tokenizer."""
    try:
        info = classifier_of(hf_config_of(model_dir, overrides))
    except ValueError as exc:
        raise UnsupportedModelError(str(exc)) from None
    if info is None:
        return None
    ids: tuple[int, ...] = ()
    if info.from_tokens:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(model_dir))
        ids = tuple(tok.convert_tokens_to_ids(t) for t in info.from_tokens)
        bad = [t for t, i in zip(info.from_tokens, ids)
               if i is None or not 0 <= i < cfg.vocab_size
               or (i == tok.unk_token_id and t != tok.unk_token)]
        if bad:
            raise UnsupportedModelError(f"classifier_from_token: {bad} are not tokens of "
                                        "the model's vocabulary")
    return ClassifierHead(info, cfg.hidden_size, ids)


def load_hf_dir(
    model_dir: Path, dtype: torch.dtype, max_positions: int | None = None, pack: bool = True,
    hf_overrides: dict[str, Any] | None = None,
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """pack: move the matrices into the core's packed layout (the fast CPU path); off
    leaves plain torch parameters (tests that edit weights after loading).
    hf_overrides: --hf-overrides, merged over config.json. A sequence classifier
    (actors.params.classify) gets its head as ``model.classifier``."""
    cfg = ModelConfig.from_dir(model_dir, hf_overrides)
    head = _classifier_head(model_dir, cfg, hf_overrides)
    if head is not None and not head.info.bert and head.info.method is None:
        # a *ForSequenceClassification checkpoint keeps a score layer and no LM head
        cfg = replace(cfg, tie_word_embeddings=True)
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
            weights = iter_weights(files, model.dtype)
            model.load_weights(weights if head is None else head.divert(weights))
    if head is not None:
        head.finish()
        model.classifier = head
    if pack:
        model.pack_weights()
    return model, cfg
