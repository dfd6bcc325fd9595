"""Tensor names: llama.cpp's GGUF names -> transformers' checkpoint names -> our packed matrices.

llama.cpp names a layer's tensors ``blk.N.<part>.weight`` (gguf-py's TENSOR_NAMES); which
transformers module a part is depends on the family (Gemma's ``ffn_norm`` is the
pre-feedforward norm, Llama's the post-attention one; phi3's ``ffn_up`` is the fused
gate+up matrix). ``hf_names`` maps one GGUF tensor to the names transformers'
``save_pretrained`` writes for that model: one name, or one per expert for the 3-D MoE
tensors (``blk.N.ffn_gate_exps`` [E, I, H] -> ``...experts.E.gate_proj`` for qwen3_moe,
``...block_sparse_moe.experts.E.w1`` for Mixtral; older Mixtral files hold 2-D
``blk.N.ffn_gate.E`` per expert, mapped the same way).

``packed_slot`` maps a checkpoint name to the matrix our model packs it into (q/k/v rows
stacked into ``self_attn.qkv_proj``, gate/up into ``mlp.gate_up_proj``, per expert
``mlp.experts.E.gate_up_proj``; Mixtral's w1/w3/w2 use the same internal names), and
``matrix_parts`` is its inverse, for any family.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np

from actors.models.config import UnsupportedModelError

GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LLAMA = {
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
_QK_NORM = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_GEMMA_NORMS = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# Expert parts carry "{e}", filled per expert.
_QWEN_MOE = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.{e}.gate_proj",
    "ffn_up_exps": "mlp.experts.{e}.up_proj",
    "ffn_down_exps": "mlp.experts.{e}.down_proj",
}
_MIXTRAL_MOE = {
    "ffn_gate_inp": "block_sparse_moe.gate",
    "ffn_gate_exps": "block_sparse_moe.experts.{e}.w1",
    "ffn_down_exps": "block_sparse_moe.experts.{e}.w2",
    "ffn_up_exps": "block_sparse_moe.experts.{e}.w3",
}
_OLMO2 = {k: v for k, v in _LLAMA.items() if k not in ("attn_norm", "ffn_norm")}

# transformers model_type -> {GGUF layer part: module path inside model.layers.N}
LAYER_NAMES: dict[str, dict[str, str]] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "granite": _LLAMA,
    "qwen3": {**_LLAMA, **_QK_NORM},
    "qwen3_moe": {**_LLAMA, **_QK_NORM, **_QWEN_MOE},
    "mixtral": {**_LLAMA, **_MIXTRAL_MOE},
    "gemma2": {**_LLAMA, **_GEMMA_NORMS},
    "gemma3_text": {**_LLAMA, **_GEMMA_NORMS, **_QK_NORM},
    "olmo2": {**_OLMO2, **_QK_NORM, "post_attention_norm": "post_attention_layernorm",
              "post_ffw_norm": "post_feedforward_layernorm"},
    "phi3": {**_LLAMA, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
}

_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)(?:\.(\d+))?\.(weight|bias)$")
_GLOBAL_RE = re.compile(r"^([a-z_]+)\.(weight|bias)$")
# Older Mixtral GGUFs: one 2-D tensor per expert, blk.N.ffn_gate.E.weight.
_PER_EXPERT = {"ffn_gate": "ffn_gate_exps", "ffn_up": "ffn_up_exps", "ffn_down": "ffn_down_exps"}


def hf_names(gguf_name: str, model_type: str, shape: tuple[int, ...]) -> list[str]:
    """transformers' names for one GGUF tensor of numpy shape ``shape``: one name, or one
    per expert (the leading axis) for a 3-D expert tensor."""
    table = LAYER_NAMES[model_type]
    g = _GLOBAL_RE.match(gguf_name)
    if g is not None and g.group(1) in GLOBAL_NAMES:
        return [f"{GLOBAL_NAMES[g.group(1)]}.{g.group(2)}"]
    m = _LAYER_RE.match(gguf_name)
    part = None if m is None else m.group(2)
    if m is not None and m.group(3) is not None:  # a per-expert 2-D tensor
        part = _PER_EXPERT.get(part or "")
    if m is None or part not in table:
        raise UnsupportedModelError(
            f"GGUF tensor {gguf_name!r} has no place in a {model_type} model"
        )
    layer, kind, path = m.group(1), m.group(4), table[part]
    prefix = f"model.layers.{layer}."
    if "{e}" not in path:
        return [f"{prefix}{path}.{kind}"]
    if m.group(3) is not None:
        return [f"{prefix}{path.format(e=m.group(3))}.{kind}"]
    if len(shape) != 3:
        raise UnsupportedModelError(f"GGUF tensor {gguf_name!r} should be 3-D, is {shape}")
    return [f"{prefix}{path.format(e=e)}.{kind}" for e in range(shape[0])]


def hf_tensor_name(gguf_name: str, model_type: str = "llama") -> str:
    """The one transformers name of a GGUF tensor (expert stacks have one per expert:
    hf_names)."""
    names = hf_names(gguf_name, model_type, ())
    return names[0]


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's convert_hf_to_gguf permute(): rows of each head go from
    interleaved pairs (x0, x_h, x1, x_h+1, ...) back to halves (x0..x_h-1, x_h..)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def split_experts(names: list[str], w: np.ndarray) -> Iterator[tuple[str, np.ndarray]]:
    """(name, matrix) pairs: a 3-D stack's per-expert views, else the one tensor."""
    if len(names) == 1:
        yield names[0], w
        return
    for e, name in enumerate(names):
        yield name, w[e]


# Checkpoint module (inside model.layers.N, experts as "{e}") -> (our packed module, slot,
# number of slots): the slots are stacked by rows in slot order.
_PACKED: dict[str, tuple[str, int, int]] = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0, 3),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1, 3),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2, 3),
    "self_attn.qkv_proj": ("self_attn.qkv_proj", 0, 1),
    "self_attn.o_proj": ("self_attn.o_proj", 0, 1),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0, 2),
    "mlp.up_proj": ("mlp.gate_up_proj", 1, 2),
    "mlp.gate_up_proj": ("mlp.gate_up_proj", 0, 1),
    "mlp.down_proj": ("mlp.down_proj", 0, 1),
    "mlp.experts.{e}.gate_proj": ("mlp.experts.{e}.gate_up_proj", 0, 2),
    "mlp.experts.{e}.up_proj": ("mlp.experts.{e}.gate_up_proj", 1, 2),
    "mlp.experts.{e}.down_proj": ("mlp.experts.{e}.down_proj", 0, 1),
    "block_sparse_moe.experts.{e}.w1": ("mlp.experts.{e}.gate_up_proj", 0, 2),
    "block_sparse_moe.experts.{e}.w3": ("mlp.experts.{e}.gate_up_proj", 1, 2),
    "block_sparse_moe.experts.{e}.w2": ("mlp.experts.{e}.down_proj", 0, 1),
}
_MODULE_RE = re.compile(r"^(model\.layers\.\d+\.)(.+?)(?:\.weight)?$")
_EXPERT_RE = re.compile(r"\.experts\.(\d+)\.")


def _split(name: str) -> tuple[str, str, str | None] | None:
    """(layer prefix, module path with "{e}", expert index) of a layer module name."""
    m = _MODULE_RE.match(name)
    if m is None:
        return None
    e = _EXPERT_RE.search(m.group(2))
    path = _EXPERT_RE.sub(".experts.{e}.", m.group(2))
    return m.group(1), path, None if e is None else e.group(1)


def packed_slot(hf_name: str, tied: bool) -> tuple[str, int, int] | None:
    """The packed matrix a checkpoint weight goes into: (module, slot, slots), or None for
    what stays float (norms, biases, the router, an untied embedding)."""
    if hf_name == "lm_head.weight":
        return None if tied else ("lm_head", 0, 1)
    if hf_name == "model.embed_tokens.weight":
        return ("model.embed_tokens", 0, 1) if tied else None
    if not hf_name.endswith(".weight"):
        return None
    parts = _split(hf_name)
    if parts is None or parts[1] not in _PACKED:
        return None
    prefix, path, e = parts
    module, slot, n = _PACKED[path]
    return prefix + module.replace("{e}", e or ""), slot, n


def matrix_parts(module: str) -> tuple[str, ...]:
    """The checkpoint modules a packed matrix can be made of, in any family's names
    (``...self_attn.qkv_proj`` -> q, k, v and phi3's fused qkv_proj; an expert's
    ``gate_up_proj`` -> qwen3_moe's gate/up and Mixtral's w1/w3), else the module itself."""
    parts = _split(module)
    if parts is None:
        return (module,)
    prefix, path, e = parts
    found = tuple(prefix + src.replace("{e}", e or "")
                  for src, (dst, _, _) in _PACKED.items() if dst == path)
    return found or (module,)
