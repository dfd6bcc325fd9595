"""The decoder's blocks, composed from ``DecoderOptions`` (arch.py): attention with its
options (bias, q/k norm per head or over the projection, per-layer RoPE, the layer's
window, scale and soft-cap given to the attention backend), the gated MLP (SiLU or
GELU-tanh), the sparse mixture of experts, and the layer that places the norms as the
family does ("pre", "sandwich" or "post").

This is the module-by-module path (any device and dtype); decoder_native.py runs the same
arithmetic as one core call per operation on the CPU, and is tested equal to it.

Weights are stored fused: q/k/v as one [q+2kv, hidden] matrix and gate/up as one
[2*inter, hidden] matrix (an expert's too), so each layer runs three projections' worth of
matmuls as two; ``DecoderForCausalLM.load_weights`` fills the fused slices.
"""

from __future__ import annotations

import llmcore
import torch
import torch.nn.functional as F
from torch import nn

from actors.models import lora
from actors.models.attention import AttentionBackend
from actors.models.config import ModelConfig
from actors.models.layers import ACTIVATIONS, Linear, RMSNorm
from actors.models.rope import apply_rotary_

RopeTables = tuple[torch.Tensor, torch.Tensor]  # cos, sin rows for the batch's positions


class Attention(nn.Module):
    def __init__(
        self, cfg: ModelConfig, layer_idx: int, dtype: torch.dtype, compute_dtype: torch.dtype
    ) -> None:
        super().__init__()
        opts = cfg.arch
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        qkv_size = cfg.q_size + 2 * cfg.kv_size
        self.qkv_proj = Linear(cfg.hidden_size, qkv_size, cfg.qkv_bias, dtype, compute_dtype)
        self.o_proj = Linear(cfg.q_size, cfg.hidden_size, cfg.o_bias, dtype, compute_dtype)
        self.qk_norm = opts.qk_norm
        if opts.qk_norm is not None:
            per_head = opts.qk_norm == "head"
            eps, off = cfg.rms_norm_eps, opts.norm_offset
            self.q_norm = RMSNorm(cfg.head_dim if per_head else cfg.q_size, eps, dtype, off)
            self.k_norm = RMSNorm(cfg.head_dim if per_head else cfg.kv_size, eps, dtype, off)

    def forward(self, x: torch.Tensor, rope: RopeTables, backend: AttentionBackend) -> torch.Tensor:
        t = x.shape[0]
        qkv = lora.apply(self.qkv_proj(x), x, self.layer_idx, "qkv")
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        # Contiguous per-head views: the backend may hand them to native code.
        q = q.reshape(t, self.num_heads, self.head_dim).contiguous()
        k = k.reshape(t, self.num_kv_heads, self.head_dim).contiguous()
        v = v.reshape(t, self.num_kv_heads, self.head_dim).contiguous()
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        apply_rotary_(q, k, rope)
        out = backend.attn(self.layer_idx, q, k, v)
        o = out.reshape(t, self.q_size)
        return lora.apply(self.o_proj(o), o, self.layer_idx, "o")


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int, act: str, dtype: torch.dtype,
                 compute_dtype: torch.dtype, layer_idx: int = 0, lora_sites: bool = True) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.inter = inter
        self.act = ACTIVATIONS[act]
        self.lora_sites = lora_sites
        self.gate_up_proj = Linear(hidden, 2 * inter, False, dtype, compute_dtype)
        self.down_proj = Linear(inter, hidden, False, dtype, compute_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.lora_sites:  # an expert: LoRA targets the dense projections only
            return self.down_proj(self.act(self.gate_up_proj(x), self.inter))
        gu = lora.apply(self.gate_up_proj(x), x, self.layer_idx, "gate_up")
        act = self.act(gu, self.inter)
        return lora.apply(self.down_proj(act), act, self.layer_idx, "down")


class SparseMoE(nn.Module):
    """Router ``gate`` [experts, hidden] and the experts, each a SiLU-gated MLP. On the CPU
    with packed experts the core runs them all in one call (``llmcore.moe_experts``: the
    rows grouped by expert, one product per expert used); else a loop over the experts
    used, as transformers runs them."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, dtype: torch.dtype,
                 compute_dtype: torch.dtype) -> None:
        super().__init__()
        moe = cfg.arch.moe
        assert moe is not None
        self.top_k, self.norm_topk = moe.top_k, moe.norm_topk_prob
        self.gate = Linear(cfg.hidden_size, moe.num_experts, False, dtype, compute_dtype)
        self.experts = nn.ModuleList(
            MLP(cfg.hidden_size, moe.intermediate_size, "silu", dtype, compute_dtype, layer_idx,
                lora_sites=False) for _ in range(moe.num_experts))
        self._packed: llmcore.PackedExperts | None = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(expert ids [T, k] int64, weights [T, k] in x's dtype) for each row."""
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids, weights.to(x.dtype)

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        ids, weights = self.route(x)
        if self.experts[0].gate_up_proj.packed is not None and x.dtype == torch.float32:
            if self._packed is None:  # built once: the experts' matrices, packed at load
                self._packed = llmcore.PackedExperts(
                    [e.gate_up_proj.packed for e in self.experts],
                    [e.down_proj.packed for e in self.experts])
            out = x.new_empty(x.shape) if out is None else out
            return llmcore.moe_experts(x, ids, weights.float(), self._packed, out)
        result = torch.zeros_like(x)
        for e in torch.unique(ids).tolist():
            rows, slot = torch.nonzero(ids == e, as_tuple=True)
            y = self.experts[e](x.index_select(0, rows)) * weights[rows, slot, None]
            result.index_add_(0, rows, y)
        if out is not None:
            return out.copy_(result)
        return result


class DecoderLayer(nn.Module):
    def __init__(
        self, cfg: ModelConfig, layer_idx: int, dtype: torch.dtype, compute_dtype: torch.dtype
    ) -> None:
        super().__init__()
        opts = cfg.arch
        self.layout = opts.norm_layout
        self.residual_scale = opts.residual_scale

        def norm() -> RMSNorm:
            return RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, opts.norm_offset)

        if self.layout != "post":
            self.input_layernorm = norm()
        self.self_attn = Attention(cfg, layer_idx, dtype, compute_dtype)
        self.post_attention_layernorm = norm()
        if self.layout == "sandwich":
            self.pre_feedforward_layernorm = norm()
        if self.layout != "pre":
            self.post_feedforward_layernorm = norm()
        self.mlp: MLP | SparseMoE
        if opts.moe is not None and opts.moe.layers[layer_idx]:
            self.mlp = SparseMoE(cfg, layer_idx, dtype, compute_dtype)
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, opts.act, dtype,
                           compute_dtype, layer_idx)

    def forward(self, x: torch.Tensor, rope: RopeTables, backend: AttentionBackend) -> torch.Tensor:
        if self.layout == "pre":
            x = x + self.self_attn(self.input_layernorm(x), rope, backend) * self.residual_scale
            return x + self.mlp(self.post_attention_layernorm(x)) * self.residual_scale
        if self.layout == "sandwich":
            a = self.self_attn(self.input_layernorm(x), rope, backend)
            x = x + self.post_attention_layernorm(a)
            m = self.mlp(self.pre_feedforward_layernorm(x))
            return x + self.post_feedforward_layernorm(m)
        x = x + self.post_attention_layernorm(self.self_attn(x, rope, backend))
        return x + self.post_feedforward_layernorm(self.mlp(x))


class Embedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype),
                                   requires_grad=False)
