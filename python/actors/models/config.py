"""ModelConfig: the architecture facts our model code needs, read from a HF config.json.

Plain data, no torch: the scheduler and KV manager read head counts and sizes from it
without importing the model code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from actors.models.arch import DecoderOptions

SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear")


class UnsupportedModelError(ValueError):
    """The checkpoint describes an architecture or option this engine does not implement."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False  # attention_bias covers o_proj too, except in Qwen2 and Phi-3
    # Per-layer sliding window (None = full causal attention). A query at position p sees
    # keys at positions p - window + 1 .. p, as transformers' sliding_window_overlay does.
    sliding_windows: tuple[int | None, ...] = ()
    # {"rope_type": "llama3", "factor": ..., ...} or None for plain RoPE.
    rope_scaling: dict[str, Any] | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # What the family does differently from Llama (models/arch.py); Llama's by default.
    arch: DecoderOptions = field(default_factory=DecoderOptions)
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_dir(cls, model_dir: str | Path,
                 overrides: dict[str, Any] | None = None) -> ModelConfig:
        """``overrides``: --hf-overrides, merged over config.json's keys."""
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: a model directory needs a config.json")
        hf = {**json.loads(path.read_text()), **(overrides or {})}
        gen = Path(model_dir) / "generation_config.json"
        if hf.get("model_type") == "whisper" and gen.is_file():
            # newer Whisper checkpoints keep their decoding rules there
            rules = json.loads(gen.read_text())
            for key in ("suppress_tokens", "begin_suppress_tokens"):
                if not hf.get(key) and rules.get(key):
                    hf[key] = rules[key]
        cfg = cls.from_hf_dict(hf)
        st = Path(model_dir) / "sentence_bert_config.json"
        if st.is_file():
            # A sentence-transformers model is trained (and truncated) to max_seq_length;
            # vLLM caps the context there too.
            limit = json.loads(st.read_text()).get("max_seq_length")
            if isinstance(limit, int) and 0 < limit < cfg.max_position_embeddings:
                cfg = replace(cfg, max_position_embeddings=limit)
        return cfg

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any]) -> ModelConfig:
        model_type = hf.get("model_type", "")
        if model_type == "gemma3" and isinstance(hf.get("text_config"), dict):
            # multimodal Gemma 3: its text model is served (images are not)
            hf = {**{k: hf[k] for k in ("eos_token_id", "bos_token_id") if k in hf},
                  **hf["text_config"], "model_type": "gemma3_text"}
            model_type = "gemma3_text"
        if model_type == "bert":
            return _bert_config(hf)
        if model_type == "whisper":
            return _whisper_config(hf)
        from actors.models.families import SUPPORTED_MODEL_TYPES, family

        fam = family(model_type)
        if fam is None:
            raise UnsupportedModelError(
                f"model_type {model_type!r} is not supported (supported: "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}; bert for pooling, whisper for speech)"
            )
        act = hf.get("hidden_activation") or hf.get("hidden_act", "silu")
        if act not in fam.activations:
            raise UnsupportedModelError(
                f"{model_type} hidden_act {act!r} is not supported "
                f"(supported: {', '.join(fam.activations)})")
        if hf.get("mlp_bias"):
            raise UnsupportedModelError("mlp_bias=true is not supported")
        num_heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        num_layers = int(hf["num_hidden_layers"])
        head_dim = hf.get("head_dim") or hidden // num_heads
        rope_theta, rope_scaling = rope_of(hf)
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        options, overrides = fam.options(hf, num_layers)
        fields: dict[str, Any] = dict(
            model_type=model_type,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
            o_bias=model_type not in ("qwen2", "phi3") and bool(hf.get("attention_bias", False)),
            sliding_windows=_sliding_windows(hf, model_type, num_layers),
            rope_scaling=rope_scaling,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            arch=options,
        )
        fields.update(overrides)
        return cls(**fields)


def _bert_config(hf: dict[str, Any]) -> ModelConfig:
    """A BERT encoder (bidirectional, absolute positions, post-LayerNorm, GELU): the
    facts the engine needs, in the decoder's field names (``rms_norm_eps`` holds the
    LayerNorm eps; no RoPE; K/V heads equal the heads)."""
    act = hf.get("hidden_act", "gelu")
    if act != "gelu":
        raise UnsupportedModelError(f"bert hidden_act {act!r} is not supported (only gelu)")
    kind = hf.get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise UnsupportedModelError(f"bert position_embedding_type {kind!r} is not supported")
    num_heads = int(hf["num_attention_heads"])
    hidden = int(hf["hidden_size"])
    positions = int(hf.get("max_position_embeddings", 512))
    return ModelConfig(
        model_type="bert",
        vocab_size=int(hf["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=num_heads,
        head_dim=hidden // num_heads,
        rms_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
        rope_theta=0.0,
        max_position_embeddings=positions,
        tie_word_embeddings=False,
        extra={"type_vocab_size": int(hf.get("type_vocab_size", 2)),
               "position_table": positions},
    )


def _whisper_config(hf: dict[str, Any]) -> ModelConfig:
    """Whisper (speech to text): the decoder's facts in the decoder field names (its
    learned position table bounds the context: 448), the encoder's and the decoding
    rules (suppressed tokens, the special ids) in ``extra``."""
    act = hf.get("activation_function", "gelu")
    if act != "gelu":
        raise UnsupportedModelError(f"whisper activation_function {act!r} is not supported")
    d = int(hf["d_model"])
    heads = int(hf["decoder_attention_heads"])
    eos = hf.get("eos_token_id", 50257)
    return ModelConfig(
        model_type="whisper",
        vocab_size=int(hf["vocab_size"]),
        hidden_size=d,
        intermediate_size=int(hf["decoder_ffn_dim"]),
        num_layers=int(hf["decoder_layers"]),
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=d // heads,
        rms_norm_eps=1e-5,
        rope_theta=0.0,
        max_position_embeddings=int(hf.get("max_target_positions", 448)),
        tie_word_embeddings=True,
        bos_token_id=hf.get("decoder_start_token_id", 50258),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else (int(eos),),
        extra={
            "num_mel_bins": int(hf.get("num_mel_bins", 80)),
            "encoder_layers": int(hf["encoder_layers"]),
            "encoder_heads": int(hf["encoder_attention_heads"]),
            "encoder_ffn_dim": int(hf["encoder_ffn_dim"]),
            "encoder_positions": int(hf.get("max_source_positions", 1500)),
            "suppress_tokens": tuple(int(t) for t in hf.get("suppress_tokens") or ()),
            "begin_suppress_tokens": tuple(int(t) for t in
                                           hf.get("begin_suppress_tokens") or ()),
        },
    )


def rope_of(hf: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling) of a config's RoPE; scaling None for plain RoPE."""
    # transformers >= 5 writes "rope_parameters" (theta inside); older files write
    # "rope_theta" + "rope_scaling" (with "type" in very old ones).
    params = hf.get("rope_parameters") or {}
    if "full_attention" in params:  # one entry per layer kind (Gemma 3): the global one
        params = params["full_attention"]
    scaling = hf.get("rope_scaling") or {}
    theta = float(params.get("rope_theta") or hf.get("rope_theta") or 10000.0)
    merged = {**scaling, **params}
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope scaling type {rope_type!r} is not supported (supported: "
            f"{', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    if merged.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedModelError("partial_rotary_factor != 1 is not supported")
    if rope_type == "default":
        return theta, None
    if rope_type == "linear":
        return theta, {"rope_type": "linear", "factor": float(merged["factor"])}
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [k for k in keys if k not in merged]
    if missing:
        raise UnsupportedModelError(f"llama3 rope scaling lacks {', '.join(missing)}")
    return theta, {"rope_type": "llama3", **{k: merged[k] for k in keys}}


# The families whose sliding window is off unless use_sliding_window says otherwise.
_QWEN = ("qwen2", "qwen3", "qwen3_moe")


def layer_kinds(hf: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    """Per layer "sliding_attention" or "full_attention": the config's layer_types, else
    what the family's config class derives (Gemma 2: every other layer from the first;
    Gemma 3: all but every sliding_window_pattern-th; Qwen: from max_window_layers)."""
    kinds = hf.get("layer_types")
    if kinds is not None:
        return tuple(kinds)
    t = hf.get("model_type")
    if t == "gemma2":
        return tuple("sliding_attention" if (i + 1) % 2 else "full_attention"
                     for i in range(num_layers))
    if t == "gemma3_text":
        pattern = int(hf.get("sliding_window_pattern", 6))
        return tuple("sliding_attention" if (i + 1) % pattern else "full_attention"
                     for i in range(num_layers))
    if t in _QWEN:
        first = int(hf.get("max_window_layers", num_layers))
        return tuple("sliding_attention" if i >= first else "full_attention"
                     for i in range(num_layers))
    return ("sliding_attention",) * num_layers


def _sliding_windows(
    hf: dict[str, Any], model_type: str, num_layers: int
) -> tuple[int | None, ...]:
    window = hf.get("sliding_window")
    if model_type in _QWEN and not hf.get("use_sliding_window", False):
        window = None
    if window is None:
        return (None,) * num_layers
    return tuple(int(window) if k == "sliding_attention" else None
                 for k in layer_kinds(hf, num_layers))
