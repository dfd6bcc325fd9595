"""GGUF -> Hugging Face-style directory (config.json, model.safetensors, tokenizer files,
generation_config.json), so one code path (hf.py) loads both kinds of checkpoint.

Tensors are dequantized to float32 with gguf.quants.dequantize (lossless: every quantized
value is scale * q + min in float32). Names map from llama.cpp's (blk.N.attn_q ...) to
transformers'. llama.cpp's converter permutes the rows of Q and K for the "llama"
architecture (interleaved RoPE pairs); we undo it exactly as transformers'
LlamaTensorProcessor does, which yields the rotate-half layout our RoPE expects.

``quantized_weights`` is the other way in (``--quantization gguf``): the linear matrices
stay in their GGUF blocks, packed by the core, and only the rest comes from the directory.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from actors.loader.progress import ProgressBar, log, stage
from actors.models.config import UnsupportedModelError

# Bump when the written directory's format or contents change: invalidates old caches.
CONVERTER_VERSION = 1

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
_SUPPORTED_ARCHS = ("llama", "qwen2")


def hf_tensor_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.match(gguf_name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        raise UnsupportedModelError(
            f"GGUF tensor {gguf_name!r} has no place in a Llama-family model"
        )
    return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's convert_hf_to_gguf permute(): rows of each head go from
    interleaved pairs (x0, x_h, x1, x_h+1, ...) back to halves (x0..x_h-1, x_h..)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


# ggml type numbers the core keeps quantized (lc_quant_type) -> names: the core's own table.
from llmcore import GGUF_KEPT_TYPES as QUANT_TYPES

# Our fused matrices and the HF parts they stack, in row order.
_FUSED_PARTS = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def matrix_parts(module: str) -> tuple[str, ...]:
    """The checkpoint modules a packed matrix is made of: a fused projection's parts
    (``...qkv_proj`` -> q, k, v), else the module itself."""
    for fused, parts in _FUSED_PARTS.items():
        if module.endswith("." + fused):
            prefix = module[: -len(fused)]
            return tuple(prefix + p for p in parts)
    return (module,)


def quantized_weights(gguf_path: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """Module name -> llmcore.PackedWeight holding that matrix in its GGUF block format
    (``--quantization gguf``): the projections, the LM head, and a tied embedding.

    The rows of a quantized matrix are whole blocks, so the loader's row operations apply
    to the raw bytes unchanged: Q/K un-permuted (llama), q/k/v and gate/up stacked. A
    matrix in a type the core does not keep (or a fused one whose parts differ in type)
    is left out, and the model packs its dequantized copy as usual.
    """
    import gguf
    import llmcore

    reader = gguf.GGUFReader(gguf_path)
    arch = _field(reader, "general.architecture")
    raw: dict[str, tuple[int, int, np.ndarray]] = {}  # HF matrix name -> (type, K, rows)
    for t in reader.tensors:
        if len(t.shape) != 2 or int(t.tensor_type.value) not in QUANT_TYPES:
            continue
        name = hf_tensor_name(t.name).removesuffix(".weight")
        rows = np.asarray(t.data)
        if arch == "llama" and name.endswith("q_proj"):
            rows = unpermute_qk(rows, cfg["num_attention_heads"])
        elif arch == "llama" and name.endswith("k_proj"):
            rows = unpermute_qk(rows, cfg["num_key_value_heads"])
        raw[name] = (int(t.tensor_type.value), int(t.shape[0]), rows)
    out: dict[str, Any] = {}

    def pack(name: str, parts: list[str]) -> None:
        found = [raw.get(p) for p in parts]
        if any(f is None for f in found) or len({(f[0], f[1]) for f in found}) != 1:
            return
        qtype, k = found[0][0], found[0][1]
        rows = np.ascontiguousarray(np.concatenate([f[2] for f in found]))
        out[name] = llmcore.PackedWeight.from_gguf(qtype, rows, rows.shape[0], k)

    for layer in range(cfg["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        for fused, parts in _FUSED_PARTS.items():
            pack(prefix + fused, [prefix + p for p in parts])
        for single in ("self_attn.o_proj", "mlp.down_proj"):
            pack(prefix + single, [prefix + single])
    if cfg["tie_word_embeddings"]:
        pack("model.embed_tokens", ["model.embed_tokens"])
    else:
        pack("lm_head", ["lm_head"])
    return out


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def hf_config_from_gguf(reader: Any) -> dict[str, Any]:
    arch = _field(reader, "general.architecture")
    if arch not in _SUPPORTED_ARCHS:
        raise UnsupportedModelError(
            f"GGUF architecture {arch!r} is not supported "
            f"(supported: {', '.join(_SUPPORTED_ARCHS)})"
        )
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise UnsupportedModelError(
            "this GGUF carries rope_freqs (Llama 3.1 scaled RoPE); load the Hugging Face "
            "checkpoint instead"
        )
    scaling = _field(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise UnsupportedModelError(f"GGUF rope scaling type {scaling!r} is not supported")

    def need(key: str) -> Any:
        value = _field(reader, f"{arch}.{key}")
        if value is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{key}")
        return value

    num_heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    vocab = _field(reader, f"{arch}.vocab_size")
    if vocab is None:
        vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    # llama.cpp has no "mistral" architecture; transformers tells them apart by name.
    name = str(_field(reader, "general.name", "")).lower()
    model_type = "mistral" if arch == "llama" and "mistral" in name else arch
    cfg: dict[str, Any] = {
        "architectures": [{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                           "qwen2": "Qwen2ForCausalLM"}[model_type]],
        "model_type": model_type,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(_field(reader, f"{arch}.attention.head_count_kv", num_heads)),
        "head_dim": int(_field(reader, f"{arch}.rope.dimension_count", hidden // num_heads)),
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(need("context_length")),
        "tie_word_embeddings": "output.weight" not in names,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    if model_type == "mistral":
        cfg["sliding_window"] = _field(reader, f"{arch}.attention.sliding_window")
    for key, gguf_key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                          ("pad_token_id", "padding_token_id")):
        value = _field(reader, f"tokenizer.ggml.{gguf_key}")
        if value is not None:
            cfg[key] = int(value)
    return cfg


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Writes the HF-style directory for ``gguf_path`` into ``out_dir`` (which exists)."""
    import gguf
    import torch
    from safetensors.torch import save_file

    with stage(f"reading GGUF metadata of {gguf_path.name}"):
        reader = gguf.GGUFReader(gguf_path)
        cfg = hf_config_from_gguf(reader)
    arch = _field(reader, "general.architecture")
    tensors: dict[str, torch.Tensor] = {}
    with stage(f"dequantizing {len(reader.tensors)} tensors"):
        bar = ProgressBar("converting GGUF tensors", len(reader.tensors))
        for t in reader.tensors:
            name = hf_tensor_name(t.name)
            w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
            if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
                w = unpermute_qk(w, cfg["num_attention_heads"])
            elif arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
                w = unpermute_qk(w, cfg["num_key_value_heads"])
            # F32 tensors come back as read-only views of the memory-mapped file: copy those.
            tensors[name] = torch.from_numpy(np.require(w, np.float32, ["C_CONTIGUOUS", "W"]))
            bar.advance()
    with stage("writing safetensors"):
        save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in cfg}
    if gen:
        (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    if "tokenizer.ggml.model" not in reader.fields:
        # Weights-only GGUFs exist (and are what tests write); the model still loads, but
        # text in/out needs a tokenizer from elsewhere.
        log.warning("%s carries no tokenizer; none written", gguf_path.name)
    else:
        with stage("building the tokenizer from GGUF metadata (transformers)"):
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(
                str(gguf_path.parent), gguf_file=gguf_path.name, local_files_only=True
            )
            tok.save_pretrained(str(out_dir))
    log.info("converted %s (%d tensors, %s)", gguf_path, len(reader.tensors), cfg["model_type"])
