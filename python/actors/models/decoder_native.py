"""The decoder's forward pass as one native call per operation (CPU, fp32 activations).

``build_plan`` snapshots, once, what each layer reads: its norm weights as fp32, each
matrix with the kernel that multiplies by it (the core's linear, or torch's where routing
chose it for the step's row count), the q/k norms, which RoPE table it takes. A step then
does no module attribute lookups: per layer, the qkv product, the q/k norms, RoPE in place
on the qkv buffer, attention, the o product, the MLP, and the norms placed as the family
places them, with the residual add folded into the next norm where the layout allows
(``rms_norm(x, w, eps, out, residual)`` adds x into the residual stream, then normalises).

    pre       h = norm(r);  r += attn(h);  h = norm(r);  r += mlp(h)        (Llama)
    sandwich  h = norm(r);  r += norm(attn(h));  h = norm(r);  r += norm(mlp(h))  (Gemma)
    post      r += norm(attn(r));  r += norm(mlp(r))                        (OLMo 2)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import llmcore
import torch
import torch.nn.functional as F

from actors.models import lora
from actors.models.blocks import RopeTables, SparseMoE
from actors.models.layers import PackedParts, gelu_tanh_mul, linear_parts

if TYPE_CHECKING:
    from actors.models.attention import AttentionBackend
    from actors.models.decoder import DecoderForCausalLM
    from actors.models.layers import Linear

Kernel = Callable[..., torch.Tensor]
Mat = tuple[Kernel, Any, Any]  # (kernel, matrix, bias)
Join = tuple[torch.Tensor | None, torch.Tensor | None]


@dataclass(frozen=True, slots=True)
class LayerPlan:
    in_norm: torch.Tensor | None  # None in the "post" layout
    qkv: Mat
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    rope: int
    o: Mat
    # How the attention's and the MLP's outputs join the residual stream, each as
    # (norm of the output itself, norm of the stream after the add); see ``_join``.
    after_attn: Join
    gate_up: Mat | None  # None: a sparse layer
    down: Mat | None
    moe: SparseMoE | None
    after_mlp: Join


@dataclass(frozen=True, slots=True)
class Plan:
    layers: tuple[LayerPlan, ...]
    final_norm: torch.Tensor

    def matrices(self) -> list[llmcore.PackedWeight]:
        """The packed matrices the dense products read (routing measures these)."""
        return [m[1] for lp in self.layers for m in (lp.qkv, lp.o, lp.gate_up, lp.down)
                if m is not None and isinstance(m[1], llmcore.PackedWeight)]

    def routed(self, route: Callable[[Kernel, Any], Kernel]) -> Plan:
        """This plan with each product's kernel replaced by ``route(kernel, matrix)``."""
        def r(m: Mat | None) -> Mat | None:
            return None if m is None else (route(m[0], m[1]), m[1], m[2])

        return replace(self, layers=tuple(
            replace(lp, qkv=r(lp.qkv), o=r(lp.o), gate_up=r(lp.gate_up), down=r(lp.down))
            for lp in self.layers))


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float()


def build_plan(model: DecoderForCausalLM) -> Plan:
    lin = llmcore._C.linear  # looked up now: profile_step wraps it before a rebuild

    def mat(m: Linear) -> Mat:
        return (linear_parts if isinstance(m.matrix, PackedParts) else lin, m.matrix,
                _f32(m.bias))

    def w(norm: Any) -> torch.Tensor | None:
        return None if norm is None else norm.weight.float()

    # per layout: (the block's own output norm, the stream's norm after the add)
    joins: dict[str, Callable[[Any, Any], Join]] = {
        "pre": lambda own, after: (None, w(own if own is not None else after)),
        "sandwich": lambda own, after: (w(own), w(after)),
        "post": lambda own, after: (w(own), None),
    }
    layers = model.model.layers
    out = []
    for i, layer in enumerate(layers):
        sa, mlp = layer.self_attn, layer.mlp
        nxt = (layers[i + 1].input_layernorm if i + 1 < len(layers) and layer.layout != "post"
               else model.model.norm)
        moe = mlp if isinstance(mlp, SparseMoE) else None
        out.append(LayerPlan(
            in_norm=layer.input_layernorm.weight.float() if layer.layout != "post" else None,
            qkv=mat(sa.qkv_proj),
            q_norm=_f32(sa.q_norm.weight) if sa.qk_norm else None,
            k_norm=_f32(sa.k_norm.weight) if sa.qk_norm else None,
            rope=model.layer_rope[i],
            o=mat(sa.o_proj),
            after_attn=joins[layer.layout](layer.post_attention_layernorm,
                                           getattr(layer, "pre_feedforward_layernorm", None)),
            gate_up=None if moe else mat(mlp.gate_up_proj),
            down=None if moe else mat(mlp.down_proj),
            moe=moe,
            after_mlp=joins[layer.layout](getattr(layer, "post_feedforward_layernorm", None),
                                          nxt),
        ))
    return Plan(tuple(out), model.model.norm.weight.float())


def hidden_states(model: DecoderForCausalLM, x: torch.Tensor, ropes: list[RopeTables],
                  attn: AttentionBackend) -> torch.Tensor:
    c, o = model.config, model.config.arch
    t, eps = x.shape[0], c.rms_norm_eps
    plan = model.native_plan(t)
    layout, rs = o.norm_layout, o.residual_scale
    silu = o.act == "silu"
    tables = [(cos[:, 0], sin[:, 0]) for cos, sin in ropes]
    residual = x  # the embedding rows: a fresh tensor, updated in place from here on
    # One buffer per product, reused by every layer: each is consumed before the next layer
    # writes it (q/k/v are views of qkv, read by the attention call).
    qkv = x.new_empty((t, c.q_size + 2 * c.kv_size))
    mid = x.new_empty((t, c.hidden_size))
    tmp = x.new_empty((t, c.hidden_size)) if layout != "pre" else mid
    gu = x.new_empty((t, 2 * c.intermediate_size))
    act = x.new_empty((t, c.intermediate_size))
    q = qkv[:, :c.q_size].view(t, c.num_heads, c.head_dim)
    k = qkv[:, c.q_size:c.q_size + c.kv_size].view(t, c.num_kv_heads, c.head_dim)
    v = qkv[:, c.q_size + c.kv_size:].view(t, c.num_kv_heads, c.head_dim)
    qf, kf = qkv[:, :c.q_size], qkv[:, c.q_size:c.q_size + c.kv_size]
    norm, rope_, q_size = llmcore._C.rms_norm, llmcore._C.rope, c.q_size
    per_head = o.qk_norm == "head"
    if layout == "post":
        h = residual  # attention reads the stream itself
    else:
        h = torch.empty_like(x)
        norm(residual, plan.layers[0].in_norm, eps, h, None)

    def join(y: torch.Tensor, norms: Join) -> None:
        """residual += y (or its norm), then h = the stream's norm for what reads it next
        (the "post" layout: h is the stream itself)."""
        own, after = norms
        if own is None:  # pre: the add folded into the next norm, Granite's scale first
            if rs != 1.0:
                y.mul_(rs)
            norm(y, after, eps, h, residual)
            return
        norm(y, own, eps, tmp, None)
        if after is None:
            residual.add_(tmp)
        else:
            norm(tmp, after, eps, h, residual)

    for i, lp in enumerate(plan.layers):
        f, w, b = lp.qkv
        lora.apply(f(h, w, b, qkv), h, i, "qkv")
        if lp.q_norm is not None:
            if per_head:
                q.copy_(F.rms_norm(q, (c.head_dim,), lp.q_norm, eps))
                k.copy_(F.rms_norm(k, (c.head_dim,), lp.k_norm, eps))
            else:
                qf.copy_(F.rms_norm(qf, (c.q_size,), lp.q_norm, eps))
                kf.copy_(F.rms_norm(kf, (c.kv_size,), lp.k_norm, eps))
        cos, sin = tables[lp.rope]
        rope_(q, k, cos, sin)
        a = attn.attn(i, q, k, v).reshape(t, q_size)
        f, w, b = lp.o
        join(lora.apply(f(a, w, b, mid), a, i, "o"), lp.after_attn)
        if lp.moe is not None:
            m = lp.moe(h, out=mid)
        else:
            f, w, b = lp.gate_up
            g = lora.apply(f(h, w, b, gu), h, i, "gate_up")
            if silu:
                llmcore._C.silu_mul(g, act)
            else:
                gelu_tanh_mul(g, c.intermediate_size, out=act)
            f, w, b = lp.down
            m = lora.apply(f(act, w, b, mid), act, i, "down")
        join(m, lp.after_mlp)
    if layout == "post":
        out = torch.empty_like(x)
        norm(residual, plan.final_norm, eps, out, None)
        return out
    return h
