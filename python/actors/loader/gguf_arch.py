"""GGUF metadata -> the transformers config of the same model.

Each family is one ``Family``: its transformers model_type and class, and what llama.cpp's
converter (convert_hf_to_gguf.py) did to its tensors: Q/K rows permuted for the
llama-derived converters (LlamaModel and its subclasses: llama, Mistral, Mixtral, Granite),
1 added to every RMSNorm weight for Gemma (the q/k norms included). ``hf_config_from_gguf``
reads the metadata the way llama.cpp's loader does (llama-model.cpp: its defaults where a
key is absent) and returns the keyword arguments of transformers' config class for the
model; gguf.py has transformers write config.json from them, so the file is exactly what
``save_pretrained`` writes. What transformers cannot express (per-dimension RoPE factors,
scaling kinds it lacks, partial rotary outside phi3, per-layer head counts that differ) is
refused with a one-line UnsupportedModelError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGUFValueType

from actors.loader.gguf_file import GGUFFile
from actors.models.config import UnsupportedModelError


@dataclass(frozen=True, slots=True)
class Family:
    model_type: str
    architecture: str
    permuted_qk: bool = False  # llama.cpp's LlamaModel.permute on Q/K rows (to undo)
    norm_shift: float = 0.0  # added by llama.cpp to every *norm.weight (to subtract)
    # config.json always names head_dim (else only when it differs from hidden_size /
    # num_attention_heads: the models read it with getattr, Mixtral's defaults to null)
    head_dim_always: bool = True


FAMILIES = {f.model_type: f for f in (
    Family("llama", "LlamaForCausalLM", permuted_qk=True),
    Family("mistral", "MistralForCausalLM", permuted_qk=True),
    Family("mixtral", "MixtralForCausalLM", permuted_qk=True, head_dim_always=False),
    Family("granite", "GraniteForCausalLM", permuted_qk=True, head_dim_always=False),
    Family("qwen2", "Qwen2ForCausalLM", head_dim_always=False),
    Family("qwen3", "Qwen3ForCausalLM"),
    Family("qwen3_moe", "Qwen3MoeForCausalLM"),
    Family("gemma2", "Gemma2ForCausalLM", norm_shift=1.0),
    Family("gemma3_text", "Gemma3ForCausalLM", norm_shift=1.0),
    Family("phi3", "Phi3ForCausalLM", head_dim_always=False),
    Family("olmo2", "Olmo2ForCausalLM", head_dim_always=False),
)}
# GGUF general.architecture -> model_type ("llama" also holds Mistral and Mixtral).
_ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe",
          "gemma2": "gemma2", "gemma3": "gemma3_text", "phi3": "phi3", "granite": "granite",
          "olmo2": "olmo2"}
SUPPORTED_ARCHS = tuple(sorted(_ARCHS))
# llama.cpp's layer count of the 27B models, whose attention scale is 1/sqrt(hidden/heads)
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3_text": 62}


def field(reader: GGUFFile, key: str, default: Any = None) -> Any:
    """A metadata value; a float32 as the shortest decimal that reads back the same (the
    1e-06 of the original config, not 9.999999974752427e-07)."""
    if key not in reader:
        return default
    value = reader.get(key)
    if reader.types(key) == (GGUFValueType.FLOAT32,):
        value = float(str(np.float32(value)))
    return value


def family_of(reader: GGUFFile) -> Family:
    arch = field(reader, "general.architecture")
    if arch not in _ARCHS:
        raise UnsupportedModelError(
            f"GGUF architecture {arch!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHS)}; llama includes Mistral and Mixtral)"
        )
    model_type = _ARCHS[arch]
    if arch == "llama":
        # llama.cpp has no "mistral"/"mixtral" architecture: experts make a Mixtral,
        # and transformers tells Mistral apart by name.
        if int(field(reader, "llama.expert_count", 0) or 0) > 0:
            model_type = "mixtral"
        elif "mistral" in str(field(reader, "general.name", "")).lower():
            model_type = "mistral"
    return FAMILIES[model_type]


def hf_config_from_gguf(reader: GGUFFile) -> dict[str, Any]:
    """The keyword arguments of transformers' config class (``model_type`` and
    ``architectures`` included) for the model in ``reader``."""
    fam = family_of(reader)
    arch = field(reader, "general.architecture")
    mt = fam.model_type
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise UnsupportedModelError(
            "this GGUF carries rope_freqs (Llama 3.1 scaled RoPE); load the Hugging Face "
            "checkpoint instead")
    if names & {"rope_factors_long.weight", "rope_factors_short.weight"}:
        raise UnsupportedModelError(
            "this GGUF carries LongRoPE factors (rope_factors_long/short), which are not "
            "supported; load the Hugging Face checkpoint instead")

    def get(key: str, default: Any = None) -> Any:
        return field(reader, f"{arch}.{key}", default)

    def need(key: str) -> Any:
        value = get(key)
        if value is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{key}")
        return value

    num_heads = _uniform(need("attention.head_count"), "attention.head_count")
    num_kv = _uniform(get("attention.head_count_kv", num_heads), "attention.head_count_kv")
    hidden = int(need("embedding_length"))
    layers = int(need("block_count"))
    head_dim = int(get("attention.key_length", 0) or hidden // num_heads)  # llama.cpp's
    vocab = get("vocab_size")
    if vocab is None:
        vocab = reader.array_len("tokenizer.ggml.tokens")
    cfg: dict[str, Any] = {
        "model_type": mt,
        "architectures": [fam.architecture],
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv,
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(need("context_length")),
        "tie_word_embeddings": "output.weight" not in names,
        "dtype": "float32",
    }
    if fam.head_dim_always or head_dim != hidden // num_heads:
        cfg["head_dim"] = head_dim
    rope = _rope_parameters(reader, arch, mt, head_dim)
    cfg["rope_parameters"] = rope
    for key, gguf_key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                          ("pad_token_id", "padding_token_id")):
        # one the file lacks is unknown, not the config class's default (another
        # tokenizer's id, maybe past this vocabulary)
        value = field(reader, f"tokenizer.ggml.{gguf_key}")
        cfg[key] = None if value is None else int(value)
    window = int(get("attention.sliding_window", 0) or 0)
    if mt in ("mistral", "mixtral", "phi3"):
        cfg["sliding_window"] = window or None
    elif mt == "olmo2" and window:
        raise UnsupportedModelError(
            "this olmo2 GGUF has a sliding window (an OLMo 3 model), which is not supported")
    if mt == "mixtral":
        cfg["num_local_experts"] = int(need("expert_count"))
        cfg["num_experts_per_tok"] = int(need("expert_used_count"))
    elif mt == "qwen3_moe":
        cfg["num_experts"] = int(need("expert_count"))
        cfg["num_experts_per_tok"] = int(need("expert_used_count"))
        cfg["moe_intermediate_size"] = int(need("expert_feed_forward_length"))
        cfg["norm_topk_prob"] = True  # llama.cpp's qwen3moe graph always renormalizes
    elif mt == "granite":
        # llama.cpp: an attention scale of 0 (or none) means 1/sqrt(head_dim); the others
        # scale nothing when absent.
        cfg["attention_multiplier"] = float(get("attention.scale", 0.0) or head_dim ** -0.5)
        cfg["embedding_multiplier"] = float(get("embedding_scale", 0.0) or 1.0)
        cfg["residual_multiplier"] = float(get("residual_scale", 0.0) or 1.0)
        cfg["logits_scaling"] = float(get("logit_scale", 0.0) or 1.0)
    elif mt == "phi3":
        cfg["original_max_position_embeddings"] = int(
            get("rope.scaling.original_context_length", cfg["max_position_embeddings"]))
    elif mt in ("gemma2", "gemma3_text"):
        cfg.update(_gemma(reader, arch, mt, cfg, window))
    return cfg


def _gemma(reader: GGUFFile, arch: str, mt: str, cfg: dict[str, Any], window: int) -> dict[str, Any]:
    """Gemma 2/3's attention facts as llama.cpp's loader derives them."""
    layers, hidden, heads = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
    big = layers == _GEMMA_27B_LAYERS[mt]
    out: dict[str, Any] = {
        "query_pre_attn_scalar": hidden // heads if big else cfg["head_dim"],
        "hidden_activation": "gelu_pytorch_tanh",
    }
    softcap = field(reader, f"{arch}.final_logit_softcapping")
    if mt == "gemma2":
        # llama.cpp: sliding window 4096 unless given, every other layer, softcaps 50/30
        window, pattern = window or 4096, 2
        out["attn_logit_softcapping"] = float(
            field(reader, f"{arch}.attn_logit_softcapping", 50.0))
        out["final_logit_softcapping"] = float(30.0 if softcap is None else softcap)
    else:
        # llama.cpp: no sliding window key (or 0) means every layer attends globally;
        # else every 6th layer does unless the file gives its pattern.
        pattern = field(reader, f"{arch}.attention.sliding_window_pattern", 6)
        if not window:
            pattern = 1
        out["final_logit_softcapping"] = float(softcap) if softcap else None
        out["attn_logit_softcapping"] = None
    out["sliding_window"] = window or None
    out["layer_types"] = [
        "sliding_attention" if _is_swa(pattern, i) else "full_attention" for i in range(layers)
    ]
    return out


def _is_swa(pattern: int | list[bool], layer: int) -> bool:
    # llama_hparams::set_swa_pattern: n - 1 sliding layers then a global one (0: all
    # sliding); or one flag per layer.
    if isinstance(pattern, list):
        return bool(pattern[layer])
    return pattern == 0 or layer % pattern < pattern - 1


def _uniform(value: Any, key: str) -> int:
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise UnsupportedModelError(f"GGUF {key} differs between layers ({value}), "
                                        "which is not supported")
        value = value[0]
    return int(value)


def _rope_parameters(reader: GGUFFile, arch: str, mt: str, head_dim: int) -> dict[str, Any]:
    """transformers' rope_parameters (rope_theta inside; Gemma 3: one per layer type)."""

    def get(key: str, default: Any = None) -> Any:
        return field(reader, f"{arch}.{key}", default)

    theta = float(get("rope.freq_base", 10000.0))
    scaling: dict[str, Any] = {"rope_type": "default"}
    kind = get("rope.scaling.type")
    factor = float(get("rope.scaling.factor", 0.0) or 0.0)
    if kind in (None, "none") and float(get("rope.scale_linear", 1.0)) != 1.0:
        kind, factor = "linear", float(get("rope.scale_linear"))  # older files' key
    if kind == "linear" and factor not in (0.0, 1.0):
        scaling = {"rope_type": "linear", "factor": factor}
    elif kind == "yarn":
        extra = [k for k in ("yarn_ext_factor", "yarn_attn_factor", "yarn_log_multiplier",
                             "attn_factor") if get(f"rope.scaling.{k}") is not None]
        if extra:
            raise UnsupportedModelError(
                f"GGUF YaRN parameters {', '.join(extra)} cannot be expressed in a "
                "transformers config; load the Hugging Face checkpoint instead")
        # llama.cpp: the original context is the trained one unless the file says
        orig = get("rope.scaling.original_context_length") or get("context_length")
        scaling = {"rope_type": "yarn", "factor": factor,
                   "original_max_position_embeddings": int(orig)}
        for key, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if (value := get(f"rope.scaling.{key}")) is not None:
                scaling[hf_key] = float(value)
    elif kind not in (None, "none", "linear"):
        raise UnsupportedModelError(f"GGUF rope scaling type {kind!r} is not supported")
    rot = int(get("rope.dimension_count", 0) or head_dim)
    if mt == "gemma3_text":
        # llama.cpp: the sliding layers' base is 10000 unless the file says, unscaled
        local = float(get("rope.freq_base_swa", 10000.0))
        return {"full_attention": {**scaling, "rope_theta": theta},
                "sliding_attention": {"rope_type": "default", "rope_theta": local}}
    params = {**scaling, "rope_theta": theta}
    if mt == "phi3":
        params["partial_rotary_factor"] = rot / head_dim
    elif rot != head_dim:
        raise UnsupportedModelError(
            f"GGUF rope.dimension_count {rot} differs from the head size {head_dim} "
            f"(partial rotary), which {mt} does not support")
    return params
