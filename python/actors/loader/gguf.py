"""GGUF -> Hugging Face-style directory (config.json, model.safetensors, tokenizer files,
generation_config.json), so one code path (hf.py) loads both kinds of checkpoint.

The directory is what transformers' ``save_pretrained`` writes for the same model:
config.json comes from transformers' own config class, fed the facts gguf_arch.py reads
from the metadata; tensors carry transformers' names (gguf_names.py). Tensors are
dequantized to float32 with gguf.quants.dequantize (lossless: every quantized value is
scale * q + min in float32), and what llama.cpp's converter did to them is undone: the
Q/K row permutation of the llama-derived converters (as transformers'
LlamaTensorProcessor does, giving the rotate-half layout), Gemma's +1 on RMSNorm weights.

``quantized_weights`` is the other way in (``--quantization gguf``): the linear matrices
stay in their GGUF blocks, packed by the core, and only the rest comes from the directory.

Both read the file with gguf_file.GGUFFile (the metadata without the tokenizer's arrays,
each tensor a view of one memory map), not gguf-py's GGUFReader, which takes seconds to
build an object per vocabulary entry.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from actors.loader.gguf_arch import FAMILIES, Family, family_of, hf_config_from_gguf
from actors.loader.gguf_file import GGUFFile
from actors.loader.gguf_names import (
    hf_names,
    hf_tensor_name,
    matrix_parts,
    packed_slot,
    split_experts,
    unpermute_qk,
)
from actors.loader.progress import ProgressBar, log, stage

__all__ = ["CONVERTER_VERSION", "QUANT_TYPES", "convert_gguf", "hf_config_from_gguf",
           "hf_tensor_name", "matrix_parts", "quantized_weights", "unpermute_qk"]

# Bump when the written directory's format or contents change: invalidates old caches.
CONVERTER_VERSION = 2

# ggml type numbers the core keeps quantized (lc_quant_type) -> names: the core's own table.
from llmcore import GGUF_KEPT_TYPES as QUANT_TYPES

_QK_RE = re.compile(r"^blk\.\d+\.attn_(q|k)\.(weight|bias)$")


def _qk_heads(fam: Family, cfg: dict[str, Any], gguf_name: str) -> int | None:
    """The head count to un-permute a Q/K tensor with, where llama.cpp permuted it."""
    m = _QK_RE.match(gguf_name)
    if not fam.permuted_qk or m is None:
        return None
    return cfg["num_attention_heads"] if m.group(1) == "q" else cfg["num_key_value_heads"]


def quantized_weights(gguf_path: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """Module name -> llmcore.PackedWeight holding that matrix in its GGUF block format
    (``--quantization gguf``): the projections, the experts' matrices, the LM head, and a
    tied embedding (an MoE router stays float).

    The rows of a quantized matrix are whole blocks, so the loader's row operations apply
    to the raw bytes unchanged: Q/K un-permuted (llama-derived), q/k/v and gate/up stacked,
    a 3-D expert stack sliced per expert; a fused matrix whose parts differ in type is a
    ``PackedParts`` (each part in its own format). A matrix with a part in a type the core
    does not keep is left out, and the model packs its dequantized copy as usual; the
    types left so are named in one log line.
    """
    import llmcore

    reader = GGUFFile(gguf_path)
    fam = family_of(reader)
    tied = bool(cfg["tie_word_embeddings"])
    # packed module -> its slots, each (ggml type, type name, K, rows)
    slots: dict[str, list[tuple[int, str, int, np.ndarray] | None]] = {}
    for t in reader.tensors:
        data = np.asarray(t.data)
        if data.ndim not in (2, 3):
            continue
        heads = _qk_heads(fam, cfg, t.name)
        for name, rows in split_experts(hf_names(t.name, fam.model_type, data.shape), data):
            target = packed_slot(name, tied)
            if target is None:
                continue
            module, slot, n = target
            if heads is not None:
                rows = unpermute_qk(rows, heads)
            entry = (int(t.tensor_type), t.tensor_type.name, int(t.shape[0]), rows)
            slots.setdefault(module, [None] * n)[slot] = entry
    out: dict[str, Any] = {}
    left: Counter[str] = Counter()
    for module, found in slots.items():
        parts = [f for f in found if f is not None]
        if (len(parts) != len(found) or len({f[2] for f in parts}) != 1
                or any(f[0] not in QUANT_TYPES for f in parts)):
            left.update(f[1] for f in parts)
            continue
        if len({f[0] for f in parts}) == 1:  # one format: one packed matrix
            rows = np.ascontiguousarray(np.concatenate([f[3] for f in parts]))
            out[module] = llmcore.PackedWeight.from_gguf(parts[0][0], rows, rows.shape[0],
                                                         parts[0][2])
        else:  # q/k in Q5_0 and v in Q8_0, say: each part in its own format
            from actors.models.layers import PackedParts

            out[module] = PackedParts([
                llmcore.PackedWeight.from_gguf(f[0], np.ascontiguousarray(f[3]),
                                               f[3].shape[0], f[2]) for f in parts])
    if left:
        log.info("%s: matrices left dequantized (the core keeps %s): %s", gguf_path.name,
                 "/".join(QUANT_TYPES.values()),
                 ", ".join(f"{kind} x{n}" for kind, n in left.most_common()))
    return out


def _write_hf_config(cfg: dict[str, Any], out_dir: Path) -> None:
    """config.json as transformers' save_pretrained writes it for these settings."""
    from transformers import AutoConfig

    kwargs = dict(cfg)
    AutoConfig.for_model(kwargs.pop("model_type"), **kwargs).save_pretrained(str(out_dir))


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Writes the HF-style directory for ``gguf_path`` into ``out_dir`` (which exists)."""
    import gguf
    import torch
    from safetensors.torch import save_file

    with stage(f"reading GGUF metadata of {gguf_path.name}"):
        reader = GGUFFile(gguf_path)
        cfg = hf_config_from_gguf(reader)
    fam = FAMILIES[cfg["model_type"]]
    tensors: dict[str, torch.Tensor] = {}
    with stage(f"dequantizing {len(reader.tensors)} tensors"):
        bar = ProgressBar("converting GGUF tensors", len(reader.tensors))
        for t in reader.tensors:
            w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
            if (heads := _qk_heads(fam, cfg, t.name)) is not None:
                w = unpermute_qk(w, heads)
            if fam.norm_shift and t.name.endswith("norm.weight"):
                w = w - np.float32(fam.norm_shift)
            names = hf_names(t.name, fam.model_type, w.shape)
            for name, part in split_experts(names, w):
                # F32 tensors come back as read-only views of the memory-mapped file, and
                # experts as views of their stack (a checkpoint's tensors share no
                # memory): copy those.
                if len(names) > 1 or not part.flags.writeable:
                    part = np.array(part, np.float32)
                tensors[name] = torch.from_numpy(np.ascontiguousarray(part))
            bar.advance()
    with stage("writing safetensors"):
        save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    _write_hf_config(cfg, out_dir)
    gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
           if cfg[k] is not None}
    if gen:
        (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    from actors.loader.gguf_tokenizer import write_tokenizer

    if not write_tokenizer(gguf_path, out_dir):
        # Weights-only GGUFs exist (and are what tests write); the model still loads, but
        # text in/out needs a tokenizer from elsewhere.
        log.warning("%s carries no tokenizer; none written", gguf_path.name)
    log.info("converted %s (%d tensors, %s)", gguf_path, len(reader.tensors), cfg["model_type"])
