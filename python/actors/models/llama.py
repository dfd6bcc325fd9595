"""LlamaForCausalLM: the Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM) over a
flattened batch.

Every scheduled token of every sequence is one row: input_ids [T], positions [T],
hidden [T, hidden_size]. Attention is the only operation that needs sequence boundaries,
and it is delegated to an AttentionBackend (see attention.py).

Weights are stored fused: q/k/v as one [q+2kv, hidden] matrix and gate/up as one
[2*inter, hidden] matrix, so each layer runs three projections' worth of matmuls as two.
``load_weights`` takes Hugging Face tensor names and fills the fused slices.

Two dtypes: ``dtype`` is the dtype of the large matrices (projections, embeddings) and
``compute_dtype`` that of the activations (residual stream, norms, attention inputs). They
are equal except for bf16 weights on a CPU without bf16 arithmetic: there the matrices stay
bf16 (half the bytes per token) and every product runs in fp32 through ``llmcore.linear``,
which widens the weights in registers. Every parameter (norm weights and biases included)
is stored in ``dtype``; a bf16 norm weight times an fp32 activation promotes to fp32.

On the CPU with fp32 activations, ``pack_weights`` (the loader calls it) moves every matrix
into the core's packed layout, and the forward pass runs as ten native calls a layer
(``_hidden_states_native``); the module-by-module path below is what other devices run,
and is tested equal to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import llmcore
import torch
import torch.nn.functional as F
from torch import nn

from actors.models import linear_routing, lora
from actors.models.attention import AttentionBackend, LayerAttentionSpec
from actors.models.config import ModelConfig
from actors.models.rope import RotaryEmbedding, apply_rotary_

RopeTables = tuple[torch.Tensor, torch.Tensor]  # cos, sin rows for the batch's positions


def _param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    # Uninitialised on purpose: every parameter is overwritten by load_weights, and a
    # random init of a large model would cost seconds.
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


def _widening(dtype: torch.dtype, compute_dtype: torch.dtype) -> bool:
    """True when bf16 matrices multiply fp32 activations (llmcore.linear's job)."""
    return dtype == torch.bfloat16 and compute_dtype == torch.float32


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           widen: bool) -> torch.Tensor:
    """x [T, K] @ weight [N, K]^T (+ bias); widen: bf16 weight, fp32 x (see module doc)."""
    if not widen:
        return F.linear(x, weight, bias)
    out = x.new_empty((x.shape[0], weight.shape[0]))
    return llmcore._C.linear(x, weight, bias, out)


def linear_packed(x: torch.Tensor, packed: llmcore.PackedWeight,
                  bias: torch.Tensor | None) -> torch.Tensor:
    """x [T, K] fp32 @ packed^T (+ bias) through the core."""
    out = x.new_empty((x.shape[0], packed.shape[0]))
    return llmcore._C.linear(x, packed, bias, out)


def _released(p: nn.Parameter) -> nn.Parameter:
    """An empty stand-in for a parameter whose data now lives packed in the core."""
    return nn.Parameter(torch.empty(0, dtype=p.dtype, device=p.device), requires_grad=False)


class Linear(nn.Module):
    """y = x W^T (+ b), with parameters left for load_weights to fill.

    After ``pack()`` the matrix lives in the core (``llmcore.PackedWeight``: the layout its
    kernels stream, in huge pages) and ``weight`` is an empty stand-in."""

    def __init__(
        self, in_size: int, out_size: int, bias: bool, dtype: torch.dtype,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        compute_dtype = compute_dtype or dtype
        self.widen = _widening(dtype, compute_dtype)
        self.weight = _param(out_size, in_size, dtype=dtype)
        self.bias = _param(out_size, dtype=dtype) if bias else None
        self.packed: llmcore.PackedWeight | None = None

    def pack(self, packed: llmcore.PackedWeight | None = None) -> None:
        """packed: the matrix already in the core (a quantized GGUF copy, same shape);
        default: a packed copy of ``weight``."""
        if packed is not None and tuple(packed.shape) != tuple(self.weight.shape):
            raise ValueError(f"packed weight {tuple(packed.shape)} does not match "
                             f"{tuple(self.weight.shape)}")
        self.packed = packed or llmcore.PackedWeight(self.weight.detach())
        self.weight = _released(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return linear_packed(x, self.packed, self.bias)
        return linear(x, self.weight, self.bias, self.widen)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _param(size, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in float32 whatever the activation dtype, as transformers does. A bf16
        # weight times fp32 activations (bf16 weights, fp32 compute) promotes to fp32.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    def __init__(
        self, cfg: ModelConfig, layer_idx: int, dtype: torch.dtype, compute_dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        qkv_size = cfg.q_size + 2 * cfg.kv_size
        self.qkv_proj = Linear(cfg.hidden_size, qkv_size, cfg.qkv_bias, dtype, compute_dtype)
        self.o_proj = Linear(cfg.q_size, cfg.hidden_size, False, dtype, compute_dtype)

    def forward(
        self,
        x: torch.Tensor,
        rope: RopeTables,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        t = x.shape[0]
        qkv = lora.apply(self.qkv_proj(x), x, self.layer_idx, "qkv")
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        # Contiguous per-head views: the backend may hand them to native code.
        q = q.reshape(t, self.num_heads, self.head_dim).contiguous()
        k = k.reshape(t, self.num_kv_heads, self.head_dim).contiguous()
        v = v.reshape(t, self.num_kv_heads, self.head_dim).contiguous()
        apply_rotary_(q, k, rope)
        out = backend.attn(self.layer_idx, q, k, v)
        o = out.reshape(t, self.q_size)
        return lora.apply(self.o_proj(o), o, self.layer_idx, "o")


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, compute_dtype: torch.dtype,
                 layer_idx: int = 0) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.inter = cfg.intermediate_size
        self.gate_up_proj = Linear(
            cfg.hidden_size, 2 * cfg.intermediate_size, False, dtype, compute_dtype
        )
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, False, dtype, compute_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gu = lora.apply(self.gate_up_proj(x), x, self.layer_idx, "gate_up")
        gate, up = gu.split(self.inter, dim=-1)
        act = F.silu(gate) * up
        return lora.apply(self.down_proj(act), act, self.layer_idx, "down")


class Embedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = _param(vocab_size, hidden_size, dtype=dtype)


class DecoderLayer(nn.Module):
    def __init__(
        self, cfg: ModelConfig, layer_idx: int, dtype: torch.dtype, compute_dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = Attention(cfg, layer_idx, dtype, compute_dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = MLP(cfg, dtype, compute_dtype, layer_idx)

    def forward(
        self,
        x: torch.Tensor,
        rope: RopeTables,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, compute_dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, dtype, compute_dtype) for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)


class LlamaForCausalLM(nn.Module):
    # HF name fragment -> (our fused parameter fragment, shard index within it)
    _FUSED = {
        ".q_proj.": (".qkv_proj.", 0),
        ".k_proj.": (".qkv_proj.", 1),
        ".v_proj.": (".qkv_proj.", 2),
        ".gate_proj.": (".gate_up_proj.", 0),
        ".up_proj.": (".gate_up_proj.", 1),
    }

    def __init__(
        self, cfg: ModelConfig, dtype: torch.dtype = torch.float32, max_positions: int | None = None,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        """dtype: the weights'. compute_dtype: the activations'; by default dtype, except
        float32 for bfloat16 weights (the CPU path; a device with bf16 arithmetic passes
        compute_dtype=torch.bfloat16)."""
        super().__init__()
        if compute_dtype is None:
            compute_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
        self.config = cfg
        self._native = True
        self._plan: list[tuple] | None = None
        self._routing: linear_routing.RoutingTable | None = None
        self._routed: dict[int, list[tuple]] = {}  # M bucket -> plan, where torch takes some
        self._dense: dict[int, torch.Tensor] = {}  # id(PackedWeight) -> its matrix for torch
        self._tied_packed: llmcore.PackedWeight | None = None
        self.dtype = dtype
        self.compute_dtype = compute_dtype
        self._widen = _widening(dtype, compute_dtype)
        self.model = LlamaModel(cfg, dtype, compute_dtype)
        # Tied checkpoints have no lm_head: logits reuse the embedding matrix.
        self.lm_head: Linear | None = None
        if not cfg.tie_word_embeddings:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, False, dtype, compute_dtype)
        self.rope = RotaryEmbedding(
            cfg.head_dim, max_positions or cfg.max_position_embeddings, cfg.rope_theta,
            cfg.rope_scaling,
        )

    def attention_specs(self) -> list[LayerAttentionSpec]:
        c = self.config
        return [
            LayerAttentionSpec(c.num_heads, c.num_kv_heads, c.head_dim, c.head_dim**-0.5, w)
            for w in c.sliding_windows
        ]

    def hidden_states(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend
    ) -> torch.Tensor:
        """Final-norm hidden states [T, hidden_size] for the flattened batch."""
        x = self._embed(input_ids)
        rope = self.rope(positions, x.dtype)
        if self.native and x.device.type == "cpu":
            return self._hidden_states_native(x, rope, attn)
        for layer in self.model.layers:
            x = layer(x, rope, attn)
        return self.model.norm(x)

    @property
    def native(self) -> bool:
        """Whether the forward pass runs on the core's fused CPU operations (fp32
        activations): one native call per operation of a layer, the residual add folded
        into the next norm, rotary applied in place on the qkv output. Off: the module-
        by-module torch path, which any device and dtype runs (and which CPUs without the
        core's AVX2 kernels keep: the portable ones are slower than torch's BLAS)."""
        return (self._native and self.compute_dtype == torch.float32
                and llmcore.linear_isa() != "scalar")

    @native.setter
    def native(self, on: bool) -> None:
        self._native = bool(on)

    def _hidden_states_native(
        self, x: torch.Tensor, rope: RopeTables, attn: AttentionBackend
    ) -> torch.Tensor:
        c = self.config
        t, eps = x.shape[0], c.rms_norm_eps
        cos, sin = rope[0][:, 0], rope[1][:, 0]
        plan = self._native_plan(t)
        residual = x  # the embedding rows: a fresh tensor, updated in place from here on
        h = torch.empty_like(x)
        # One buffer per projection output, reused by every layer: each is consumed before
        # the next layer writes it (q/k/v views of qkv by the attention call).
        qkv = x.new_empty((t, c.q_size + 2 * c.kv_size))
        mid = x.new_empty((t, c.hidden_size))
        gu = x.new_empty((t, 2 * c.intermediate_size))
        act = x.new_empty((t, c.intermediate_size))
        q = qkv[:, :c.q_size].view(t, c.num_heads, c.head_dim)
        k = qkv[:, c.q_size:c.q_size + c.kv_size].view(t, c.num_kv_heads, c.head_dim)
        v = qkv[:, c.q_size + c.kv_size:].view(t, c.num_kv_heads, c.head_dim)
        norm, rope_, q_size = llmcore._C.rms_norm, llmcore._C.rope, c.q_size
        norm(residual, plan[0][0], eps, h, None)
        # Each matrix comes with its kernel (the core's linear, or torch's where routing
        # chose it for this row count); both write into the same buffers.
        for i, (_, qkv_f, qkv_w, qkv_b, o_f, o_w, post_norm, gu_f, gu_w, down_f, down_w,
                next_norm) in enumerate(plan):
            lora.apply(qkv_f(h, qkv_w, qkv_b, qkv), h, i, "qkv")
            rope_(q, k, cos, sin)
            o = attn.attn(i, q, k, v).reshape(t, q_size)
            norm(lora.apply(o_f(o, o_w, None, mid), o, i, "o"), post_norm, eps, h, residual)
            llmcore._C.silu_mul(lora.apply(gu_f(h, gu_w, None, gu), h, i, "gate_up"), act)
            norm(lora.apply(down_f(act, down_w, None, mid), act, i, "down"), next_norm, eps, h,
                 residual)
        return h

    def forget_plan(self) -> None:
        """The next forward pass builds its per-layer plan again, taking the core's kernels
        as they are then (scripts/profile_step.py wraps them with timers after warm-up)."""
        self._plan, self._routed = None, {}

    def _native_plan(self, rows: int) -> list[tuple]:
        """Per layer, what the fused forward reads: (input norm, qkv kernel, qkv matrix,
        qkv bias, o kernel, o matrix, post-attention norm, gate/up kernel, gate/up matrix,
        down kernel, down matrix, next norm), built once so that a step does no module
        attribute lookups. It snapshots the weights at the first forward pass (serving
        never edits them; pack_weights rebuilds it). ``rows``: the step's row count, whose
        M bucket picks the routed plan where route_linears sent some shapes to torch."""
        if self._plan is None:
            layers = self.model.layers
            plan = []
            for i, layer in enumerate(layers):
                sa, mlp = layer.self_attn, layer.mlp
                nxt = layers[i + 1].input_layernorm if i + 1 < len(layers) else self.model.norm

                def w(lin: Linear) -> object:
                    return lin.packed if lin.packed is not None else lin.weight

                # Norm weights and the qkv bias as fp32 once (no-op copies for an fp32
                # model), so the core does not widen bf16 vectors on every call.
                qkv_bias = None if sa.qkv_proj.bias is None else sa.qkv_proj.bias.float()
                lin = llmcore._C.linear
                plan.append((layer.input_layernorm.weight.float(), lin, w(sa.qkv_proj),
                             qkv_bias, lin, w(sa.o_proj),
                             layer.post_attention_layernorm.weight.float(),
                             lin, w(mlp.gate_up_proj), lin, w(mlp.down_proj),
                             nxt.weight.float()))
            self._plan = plan
            self._routed = {}
        if self._routing is None:
            return self._plan
        b = linear_routing.bucket(rows)
        if b not in self._routed:
            self._routed[b] = [tuple(self._route(v, plan_row[j + 1], b)
                                     if j in (1, 4, 7, 9) else v
                                     for j, v in enumerate(plan_row))
                               for plan_row in self._plan]
        return self._routed[b]

    def _route(self, fn: object, weight: object, b: int) -> object:
        """The kernel for one plan entry in bucket ``b`` (``fn`` is the core's)."""
        if not isinstance(weight, llmcore.PackedWeight) or self._routing is None:
            return fn
        n, k = weight.shape
        kernel = self._routing.kernel(n, k, weight.dtype, b)
        if kernel == "core":
            return fn
        other = self._dense[id(weight)]
        return lambda x, _w, bias, out: linear_routing.apply(kernel, x, other, bias, out)

    def _logits_matrix(self) -> llmcore.PackedWeight | None:
        if self._tied_packed is not None:
            return self._tied_packed
        return self.lm_head.packed if self.lm_head is not None else None

    def route_linears(self, budget_s: float | None = None,
                      force: str | None = None,
                      table: linear_routing.RoutingTable | None = None,
                      ) -> linear_routing.RoutingTable | None:
        """Times the core against torch on this model's packed shapes (linear_routing) and
        routes each (shape, M bucket) to the faster from the next forward pass on; the
        matrices of shapes routed away anywhere get the other kernel's copy beside the packed
        one (torch's float matrix, or a quantized matrix's bf16 copy packed for the core).
        Measured once per model (a shared model keeps its table); ``table``: apply one
        measured before instead (the same shapes reloaded: the same routes, so the same
        results). None when the model runs no packed matrices (another device, or the
        module-by-module path)."""
        if self._routing is not None:
            return self._routing
        plan = self._native_plan(1) if self.native else []
        mats = [w for row in plan for w in (row[2], row[5], row[8], row[10])
                if isinstance(w, llmcore.PackedWeight)]
        head = self._logits_matrix()
        if head is not None:
            mats.append(head)
        if not mats:
            return None
        if table is None:
            table = linear_routing.measure(mats, budget_s, force)
        # a shape routed away anywhere: its matrices' copy for the kernel taking it
        routed = {(r.n, r.k, r.weight_format): r.kernel for r in table.routes
                  if r.kernel != "core"}
        for w in mats:
            kernel = routed.get((*w.shape, w.dtype))
            if kernel is not None:
                self._dense[id(w)] = linear_routing.alternative(w, kernel)
        self._routing = table
        self._routed = {}
        return table

    @property
    def routing(self) -> linear_routing.RoutingTable | None:
        """The table route_linears chose, or None (not measured, or turned off)."""
        return self._routing

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self._tied_packed is not None:  # the tied matrix lives packed: gather its rows
            out = torch.empty((input_ids.shape[0], self.config.hidden_size),
                              dtype=self.compute_dtype)
            return self._tied_packed.rows(input_ids.numpy(), out)
        return F.embedding(input_ids, self.model.embed_tokens.weight).to(self.compute_dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self._logits_matrix()
        if head is not None and id(head) in self._dense and self._routing is not None:
            b = linear_routing.bucket(hidden.shape[0])
            kernel = self._routing.kernel(*head.shape, head.dtype, b)
            if kernel != "core":
                out = hidden.new_empty((hidden.shape[0], head.shape[0]))
                return linear_routing.apply(kernel, hidden, self._dense[id(head)], None, out)
        if self._tied_packed is not None:
            return linear_packed(hidden, self._tied_packed, None)
        if self.lm_head is not None:
            return self.lm_head(hidden)
        return linear(hidden, self.model.embed_tokens.weight, None, self._widen)

    def pack_weights(self, prepacked: Mapping[str, llmcore.PackedWeight] | None = None) -> None:
        """Moves every matrix into the core's packed layout (CPU, fp32 activations): the
        projections, the LM head, and a tied embedding (looked up from the packed copy, so
        it is stored once). Call after load_weights.

        prepacked: module name (``model.layers.0.self_attn.qkv_proj``, ``lm_head``,
        ``model.embed_tokens``) -> the matrix already in the core, e.g. kept quantized from
        a GGUF file (loader.gguf.quantized_weights); those are used instead of packing."""
        prepacked = prepacked or {}
        if self.compute_dtype != torch.float32 or self.model.embed_tokens.weight.is_cuda:
            if prepacked:
                raise ValueError("quantized weights run on the CPU with float32 activations")
            return
        if llmcore.linear_isa() == "scalar" and not prepacked:
            return  # the portable packed kernel is far slower than torch's BLAS
        self._plan = None
        self._routing, self._routed, self._dense = None, {}, {}
        for name, mod in self.named_modules():
            if isinstance(mod, Linear) and mod.packed is None:
                mod.pack(prepacked.get(name))
        if self.lm_head is None and self._tied_packed is None:
            emb = self.model.embed_tokens
            self._tied_packed = prepacked.get("model.embed_tokens")
            if self._tied_packed is None:
                self._tied_packed = llmcore.PackedWeight(emb.weight.detach())
            elif tuple(self._tied_packed.shape) != tuple(emb.weight.shape):
                raise ValueError("packed embedding does not match the vocabulary")
            emb.weight = _released(emb.weight)

    def weight_formats(self) -> dict[str, int]:
        """Storage format (PackedWeight.dtype, or the torch dtype) -> number of matrices."""
        counts: dict[str, int] = {}
        mats = [m.packed if m.packed is not None else m.weight
                for m in self.modules() if isinstance(m, Linear)]
        if self.lm_head is None:
            mats.append(self._tied_packed if self._tied_packed is not None
                        else self.model.embed_tokens.weight)
        for w in mats:
            key = str(w.dtype).removeprefix("torch.")
            counts[key] = counts.get(key, 0) + 1
        return counts

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionBackend,
        logits_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [len(logits_indices) or T, vocab] for the selected rows of the batch."""
        hidden = self.hidden_states(input_ids, positions, attn)
        if logits_indices is not None:
            hidden = hidden.index_select(0, logits_indices)
        return self.compute_logits(hidden)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies HF-named tensors into our (possibly fused) parameters.

        Raises if a tensor has no home or a parameter was never written, so a checkpoint
        that does not fit the config fails loudly instead of running on garbage.
        """
        params = dict(self.named_parameters(remove_duplicate=False))
        written: set[str] = set()
        c = self.config
        for hf_name, tensor in weights:
            if "rotary_emb.inv_freq" in hf_name:
                continue
            if hf_name == "lm_head.weight" and c.tie_word_embeddings:
                continue  # some checkpoints store the tied copy as well
            name, shard = hf_name, None
            for frag, (fused, idx) in self._FUSED.items():
                if frag in hf_name:
                    name, shard = hf_name.replace(frag, fused), idx
                    break
            if name not in params:
                raise KeyError(f"checkpoint tensor {hf_name!r} has no matching parameter")
            dst = params[name]
            if shard is not None:
                dst = dst.narrow(0, *self._shard_range(name, shard))
            if tuple(dst.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"{hf_name}: checkpoint shape {tuple(tensor.shape)} "
                    f"!= expected {tuple(dst.shape)}"
                )
            dst.copy_(tensor)
            written.add(name if shard is None else f"{name}#{shard}")
        self._check_complete(written)

    def _shard_range(self, name: str, shard: int) -> tuple[int, int]:
        c = self.config
        if ".qkv_proj." in name:
            sizes = [c.q_size, c.kv_size, c.kv_size]
        else:
            sizes = [c.intermediate_size, c.intermediate_size]
        return sum(sizes[:shard]), sizes[shard]

    def _check_complete(self, written: set[str]) -> None:
        missing = []
        for name, _ in self.named_parameters():
            if ".qkv_proj." in name:
                parts = [f"{name}#{i}" for i in range(3)]
            elif ".gate_up_proj." in name:
                parts = [f"{name}#{i}" for i in range(2)]
            else:
                parts = [name]
            missing += [p for p in parts if p not in written]
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise ValueError(f"checkpoint lacks {len(missing)} tensors: {shown}")
