"""A transformers checkpoint directory -> GGUF, the way llama.cpp's convert_hf_to_gguf.py does
it, for tests: the checkpoint's tensors as saved (per-expert MoE names), renamed by gguf-py's
own TensorNameMap, with the converter's transforms (Q/K rows permuted by LlamaModel and its
subclasses: llama, Mistral, Mixtral, Granite; +1 on every Gemma norm weight; expert
matrices stacked into 3-D ``ffn_*_exps``) and its metadata keys. Tensors are F32 (exact
round trips) unless ``qtype`` names a block type for the matrices (norms, the MoE router
and other 1-D tensors stay F32, as the converter keeps them).

It is independent of the loader under test: nothing here imports actors.loader.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

# transformers model_type -> GGUF architecture
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "granite": "granite",
             "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "gemma2": "gemma2",
             "gemma3_text": "gemma3", "phi3": "phi3", "olmo2": "olmo2"}
PERMUTED = ("llama", "mistral", "mixtral", "granite")  # LlamaModel.modify_tensors
_EXPERT_RE = re.compile(
    r"^model\.layers\.(\d+)\.(?:mlp\.experts|block_sparse_moe\.experts)\.(\d+)\."
    r"(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
_EXPERT_PART = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up",
                "down_proj": "down", "w2": "down"}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # convert_hf_to_gguf.py: LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def export_gguf(model_dir: Path, out: Path, *, qtype: str | None = None,
                tensor_types: dict[str, str] | None = None, per_expert_tensors: bool = False,
                gemma3_pattern: bool = False, extra: dict[str, Any] | None = None) -> None:
    """Writes ``out`` from the checkpoint in ``model_dir``.

    qtype: the block type of the matrices ("Q8_0", ...; None: all F32); tensor_types: a
    type for some tensors by GGUF name, as llama.cpp's quantizer mixes them.
    per_expert_tensors: Mixtral experts as older converters wrote them (2-D
    ``blk.N.ffn_gate.E.weight``). gemma3_pattern: write the sliding-window pattern and the
    local RoPE base, as newer converters do (older files lack both). extra: more metadata,
    {key without the "<arch>." prefix: value}.
    """
    import gguf
    from safetensors.numpy import load_file

    hf = json.loads((model_dir / "config.json").read_text())
    mt = hf["model_type"]
    arch = GGUF_ARCH[mt]
    tensors: dict[str, np.ndarray] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(f))
    n_layers = hf["num_hidden_layers"]
    name_map = gguf.get_tensor_name_map(
        next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), n_layers)
    w = gguf.GGUFWriter(str(out), arch)
    _metadata(w, hf, mt, gemma3_pattern)
    ftype = "ALL_F32" if qtype is None else f"MOSTLY_{qtype}"
    w.add_file_type(int(gguf.LlamaFileType[ftype]))
    for key, value in (extra or {}).items():
        full = f"{arch}.{key}"
        if isinstance(value, str):
            w.add_string(full, value)
        elif isinstance(value, float):
            w.add_float32(full, value)
        else:
            w.add_uint32(full, value)

    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    out_tensors: list[tuple[str, np.ndarray]] = []
    heads, kv_heads = hf["num_attention_heads"], hf["num_key_value_heads"]
    for name, data in tensors.items():
        data = data.astype(np.float32)
        if m := _EXPERT_RE.match(name):
            layer, e, part = int(m.group(1)), int(m.group(2)), _EXPERT_PART[m.group(3)]
            if per_expert_tensors:
                out_tensors.append((f"blk.{layer}.ffn_{part}.{e}.weight", data))
            else:
                experts.setdefault((layer, part), {})[e] = data
            continue
        if mt in PERMUTED and re.search(r"\.q_proj\.(weight|bias)$", name):
            data = llama_cpp_permute(data, heads)
        elif mt in PERMUTED and re.search(r"\.k_proj\.(weight|bias)$", name):
            data = llama_cpp_permute(data, kv_heads)
        if mt in ("gemma2", "gemma3_text") and name.endswith("norm.weight"):
            data = data + 1
        new = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ValueError(f"llama.cpp has no name for {name} in {arch}")
        out_tensors.append((new, data))
    for (layer, part), by_e in sorted(experts.items()):
        stack = np.stack([by_e[e] for e in sorted(by_e)])
        out_tensors.append((f"blk.{layer}.ffn_{part}_exps.weight", stack))
    for name, data in out_tensors:
        _add_tensor(w, gguf, name, np.ascontiguousarray(data),
                    (tensor_types or {}).get(name, qtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _add_tensor(w: Any, gguf: Any, name: str, data: np.ndarray, qtype: str | None) -> None:
    keep_f32 = data.ndim < 2 or name.endswith("ffn_gate_inp.weight")
    if qtype is None or keep_f32 or data.shape[-1] % 32:
        w.add_tensor(name, data)
        return
    t = gguf.GGMLQuantizationType[qtype]
    q = gguf.quants.quantize(data, t)
    w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=t)


def _metadata(w: Any, hf: dict[str, Any], mt: str, gemma3_pattern: bool) -> None:
    """The keys convert_hf_to_gguf.py writes for the family (TextModel's common ones and
    the family's own)."""
    import gguf

    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    rope = hf.get("rope_parameters") or {}
    w.add_name(f"tiny {mt}")
    w.add_vocab_size(hf["vocab_size"])  # weights-only test files carry no token list
    w.add_block_count(hf["num_hidden_layers"])
    w.add_context_length(hf["max_position_embeddings"])
    w.add_embedding_length(hf["hidden_size"])
    w.add_feed_forward_length(hf["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(hf["num_key_value_heads"])
    w.add_layer_norm_rms_eps(hf["rms_norm_eps"])
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                     ("pad_token_id", w.add_pad_token_id)):
        if hf.get(key) is not None:  # gguf.SpecialVocab writes them with the tokenizer
            add(hf[key])
    if mt != "gemma2":  # Gemma2Model writes no RoPE base (llama.cpp's default: 10000)
        w.add_rope_freq_base(rope.get("full_attention", rope)["rope_theta"])
    scaling = rope.get("full_attention", rope)
    if scaling.get("rope_type") == "linear":  # TextModel.set_gguf_parameters
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(scaling["factor"])
    if mt in ("llama", "mistral", "mixtral", "granite"):
        w.add_rope_dimension_count(head_dim)  # LlamaModel
    if hf.get("head_dim") is not None and mt != "granite":  # GraniteModel drops it
        w.add_key_length(head_dim)  # TextModel, for a head_dim in the config
        w.add_value_length(head_dim)
    if mt in ("mixtral", "qwen3_moe"):
        w.add_expert_count(hf.get("num_local_experts") or hf["num_experts"])
        w.add_expert_used_count(hf["num_experts_per_tok"])
    if mt == "qwen3_moe":
        w.add_expert_feed_forward_length(hf["moe_intermediate_size"])
    if mt == "granite":  # GraniteModel: the multipliers as scales, when truthy
        w.add_attention_scale(hf["attention_multiplier"])
        w.add_embedding_scale(hf["embedding_multiplier"])
        w.add_residual_scale(hf["residual_multiplier"])
        w.add_logit_scale(hf["logits_scaling"])
    if mt == "phi3":
        w.add_rope_dimension_count(int(rope.get("partial_rotary_factor", 1.0) * head_dim))
        w.add_rope_scaling_orig_ctx_len(hf["original_max_position_embeddings"])
        w.add_sliding_window(hf.get("sliding_window") or 0)
    if mt == "gemma2":
        w.add_attn_logit_softcapping(hf["attn_logit_softcapping"])
        w.add_final_logit_softcapping(hf["final_logit_softcapping"])
        w.add_sliding_window(hf["sliding_window"])
    if mt == "gemma3_text":
        if hf.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(hf["final_logit_softcapping"])
        w.add_sliding_window(hf["sliding_window"])
        if gemma3_pattern:
            w.add_sliding_window_pattern([t == "sliding_attention" for t in hf["layer_types"]])
            w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])

