"""What sets one decoder family apart from another, as plain data (no torch).

Every causal decoder served here is the same skeleton: embeddings, N layers of attention
and a gated MLP (or a mixture of experts) around a residual stream, a final norm and an LM
head. ``DecoderOptions`` holds the choices the families make inside that skeleton; a
family file (models/families/) maps its Hugging Face config onto them, and the model code
(decoder.py, blocks.py, decoder_native.py) composes its blocks from them alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NORM_LAYOUTS = ("pre", "sandwich", "post")


@dataclass(frozen=True, slots=True)
class MoEOptions:
    """A sparse MLP: a linear router over ``num_experts`` SiLU-gated experts, each token
    run through its ``top_k`` best, weighted by the router's softmax (renormalised over the
    chosen ones when ``norm_topk_prob``)."""

    num_experts: int
    top_k: int
    intermediate_size: int  # per expert
    norm_topk_prob: bool
    layers: tuple[bool, ...]  # per layer: True = sparse, False = the dense MLP


@dataclass(frozen=True, slots=True)
class DecoderOptions:
    # Norms: "pre" (Llama: norm before attention and before the MLP), "sandwich" (Gemma 2/3:
    # a norm before and after each), "post" (OLMo 2: after each, none before).
    norm_layout: str = "pre"
    norm_offset: float = 0.0  # Gemma: RMSNorm scales by (offset + w)
    # q/k RMSNorm before RoPE: None, "head" (per head: Qwen3, Gemma 3) or "full" (over the
    # whole projection: OLMo 2).
    qk_norm: str | None = None
    act: str = "silu"  # the gated MLP's activation: silu | gelu_tanh
    embed_scale: float = 1.0  # embeddings times this (Gemma: sqrt(hidden); Granite)
    residual_scale: float = 1.0  # each block's output times this before the add (Granite)
    attn_scale: float | None = None  # softmax scale; None: head_dim ** -0.5
    attn_softcap: float | None = None  # attention logits: cap * tanh(s / cap) (Gemma 2)
    final_softcap: float | None = None  # LM-head logits, the same (Gemma 2)
    logits_scale: float = 1.0  # LM-head logits times this (Granite: 1 / logits_scaling)
    # Per layer (theta, scaling) where layers differ (Gemma 3: local and global RoPE);
    # empty: every layer uses the config's rope_theta / rope_scaling.
    layer_rope: tuple[tuple[float, dict[str, Any] | None], ...] = ()
    moe: MoEOptions | None = None
