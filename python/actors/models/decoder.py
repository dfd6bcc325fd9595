"""DecoderForCausalLM: every causal decoder family (Llama, Mistral, Qwen2/3, Gemma 2/3,
Phi-3, Granite, OLMo 2, Qwen3-MoE, Mixtral) over a flattened batch.

Every scheduled token of every sequence is one row: input_ids [T], positions [T],
hidden [T, hidden_size]. Attention is the only operation that needs sequence boundaries,
and it is delegated to an AttentionBackend (see attention.py), which receives each layer's
window, scale and soft-cap through ``attention_specs``.

The family's choices come from ``config.arch`` (arch.py): the blocks (blocks.py) compose
themselves from them, ``load_weights`` maps the checkpoint's names (weight_map.py), and on
the CPU with fp32 activations ``pack_weights`` (the loader calls it) moves every matrix
into the core's packed layout, after which the forward pass runs as one native call per
operation (decoder_native.py); the module-by-module path is what other devices run, and is
tested equal to it.

Two dtypes: ``dtype`` is the dtype of the large matrices (projections, embeddings) and
``compute_dtype`` that of the activations (see layers.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import llmcore
import torch
import torch.nn.functional as F
from torch import nn

from actors.models import decoder_native, linear_routing, row_kernels, weight_map
from actors.models.attention import AttentionBackend, LayerAttentionSpec
from actors.models.blocks import DecoderLayer, Embedding, RopeTables
from actors.models.config import ModelConfig
from actors.models.layers import (Linear, PackedParts, RMSNorm, _released, _widening, linear,
                                  linear_packed, linear_parts)
from actors.models.rope import RotaryEmbedding


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, compute_dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, dtype, compute_dtype) for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype,
                            cfg.arch.norm_offset)


class DecoderForCausalLM(nn.Module):
    def __init__(
        self, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
        max_positions: int | None = None, compute_dtype: torch.dtype | None = None,
    ) -> None:
        """dtype: the weights'. compute_dtype: the activations'; by default dtype, except
        float32 for bfloat16 weights (the CPU path; a device with bf16 arithmetic passes
        compute_dtype=torch.bfloat16)."""
        super().__init__()
        if compute_dtype is None:
            compute_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
        self.config = cfg
        self._native = True
        self._plan: decoder_native.Plan | None = None
        self._routing: linear_routing.RoutingTable | None = None
        self._routed: dict[int, decoder_native.Plan] = {}  # M bucket -> plan, where routed
        self._dense: dict[int, torch.Tensor] = {}  # id(PackedWeight) -> its matrix for torch
        self._tied_packed: llmcore.PackedWeight | None = None
        # row_kernels: each row's kernel family by its role (use_row_kernels), and the bf16
        # copies of quantized matrices that prompt rows multiply (id of the stored matrix)
        self._row_kernels = False
        self._row_plan: decoder_native.Plan | None = None
        self._prompt_copies: dict[int, llmcore.PackedWeight] = {}
        self.dtype = dtype
        self.compute_dtype = compute_dtype
        self._widen = _widening(dtype, compute_dtype)
        self.model = DecoderModel(cfg, dtype, compute_dtype)
        # Tied checkpoints have no lm_head: logits reuse the embedding matrix.
        self.lm_head: Linear | None = None
        if not cfg.tie_word_embeddings:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, False, dtype, compute_dtype)
        # One table per distinct (theta, scaling) among the layers (Gemma 3: two), and
        # which one each layer reads.
        positions = max_positions or cfg.max_position_embeddings
        per_layer = cfg.arch.layer_rope or ((cfg.rope_theta, cfg.rope_scaling),) * cfg.num_layers
        kinds: list[tuple] = []
        self.layer_rope: list[int] = []
        for theta, scaling in per_layer:
            key = (theta, tuple(sorted((scaling or {}).items())))
            if key not in kinds:
                kinds.append(key)
            self.layer_rope.append(kinds.index(key))
        self.ropes = nn.ModuleList(
            RotaryEmbedding(cfg.head_dim, positions, theta, dict(scaling) or None)
            for theta, scaling in kinds)

    def attention_specs(self) -> list[LayerAttentionSpec]:
        c, o = self.config, self.config.arch
        scale = o.attn_scale if o.attn_scale is not None else c.head_dim ** -0.5
        return [LayerAttentionSpec(c.num_heads, c.num_kv_heads, c.head_dim, scale, w,
                                   softcap=o.attn_softcap)
                for w in c.sliding_windows]

    def rope_tables(self, positions: torch.Tensor, dtype: torch.dtype) -> list[RopeTables]:
        """The step's cos/sin rows, one pair per distinct RoPE (layer_rope indexes them)."""
        return [r(positions, dtype) for r in self.ropes]

    def hidden_states(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final-norm hidden states [T, hidden_size] for the flattened batch.
        ``inputs_embeds`` [T, hidden_size] (compute dtype, written in place): the first
        layer's input instead of ``embed(input_ids)`` (prompt embeddings)."""
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        ropes = self.rope_tables(positions, x.dtype)
        if self.native and x.device.type == "cpu":
            return decoder_native.hidden_states(self, x, ropes, attn)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, ropes[self.layer_rope[i]], attn)
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

    def forget_plan(self) -> None:
        """The next forward pass builds its per-layer plan again, taking the core's kernels
        as they are then (scripts/profile_step.py wraps them with timers after warm-up)."""
        self._plan, self._routed, self._row_plan = None, {}, None

    def native_plan(self, rows: int) -> decoder_native.Plan:
        """The per-layer plan for a step of ``rows`` rows (decoder_native.build_plan), built
        once; where route_linears sent some shapes to torch, the routed copy for the rows'
        M bucket."""
        if self._plan is None:
            self._plan = decoder_native.build_plan(self)
            self._routed, self._row_plan = {}, None
        if self._row_kernels:
            if self._row_plan is None:
                self._row_plan = self._plan.routed(self._row_route)
            return self._row_plan
        if self._routing is None:
            return self._plan
        b = linear_routing.bucket(rows)
        if b not in self._routed:
            self._routed[b] = self._plan.routed(lambda fn, w: self._route(fn, w, b))
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

    def use_row_kernels(self, prompt_copies: bool | None = None) -> int:
        """From the next forward pass on, each product's rows take the kernel family of
        their role (actors.models.row_kernels): generated-token rows the dot kernels on the
        stored matrix, prompt rows the tiles, on a bf16 copy of each quantized matrix where
        ``prompt_copies`` (default: row_kernels.prompt_copy_wanted). Returns the copies'
        bytes. Exclusive with route_linears."""
        if self._routing is not None:
            raise ValueError("this model's products are routed by row count (route_linears)")
        self._row_kernels = True
        self._row_plan = None
        if not self.native:
            return 0
        quantized = [w for w in self._all_packed() if w.dtype in linear_routing.QUANTIZED]
        nbytes = sum(2 * w.shape[0] * w.shape[1] for w in quantized)
        if prompt_copies is None:
            prompt_copies = row_kernels.prompt_copy_wanted(nbytes)
        if not prompt_copies:
            return 0
        for w in quantized:
            if id(w) not in self._prompt_copies:
                self._prompt_copies[id(w)] = linear_routing.alternative(w, "core_bf16")
        return nbytes

    def _all_packed(self) -> list[llmcore.PackedWeight]:
        """Every packed matrix of the layers' dense products, fused parts one by one."""
        plan = self._plan or decoder_native.build_plan(self)
        out: list[llmcore.PackedWeight] = []
        for lp in plan.layers:
            for m in (lp.qkv, lp.o, lp.gate_up, lp.down):
                if m is None:
                    continue
                out.extend(m[1].parts if isinstance(m[1], PackedParts)
                           else [m[1]] if isinstance(m[1], llmcore.PackedWeight) else [])
        return out

    def _row_route(self, fn: object, weight: object) -> object:
        """A plan entry's kernel under row_kernels (``fn`` is the core's)."""
        copies = self._prompt_copies
        if isinstance(weight, PackedParts):
            prompt = PackedParts([copies.get(id(p), p) for p in weight.parts])
            return row_kernels.split_kernel(
                weight, prompt,
                lambda x, w, b, o: linear_parts(x, w, b, o, kernel="dot"),
                lambda x, w, b, o: linear_parts(x, w, b, o, kernel="tiles"))
        if isinstance(weight, llmcore.PackedWeight):
            return row_kernels.split_kernel(weight, copies.get(id(weight), weight))
        return fn

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
        one. Measured once per model (a shared model keeps its table); ``table``: apply one
        measured before instead. None when the model runs no packed matrices."""
        if self._routing is not None:
            return self._routing
        mats = self.native_plan(1).matrices() if self.native else []
        head = self._logits_matrix()
        if head is not None:
            mats.append(head)
        if not mats:
            return None
        if table is None:
            table = linear_routing.measure(mats, budget_s, force)
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

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The first layer's input rows [T, hidden_size] for these tokens, a fresh tensor
        in the compute dtype: their embeddings times the family's embedding scale."""
        if self._tied_packed is not None:  # the tied matrix lives packed: gather its rows
            out = torch.empty((input_ids.shape[0], self.config.hidden_size),
                              dtype=self.compute_dtype)
            x = self._tied_packed.rows(input_ids.numpy(), out)
        else:
            x = F.embedding(input_ids, self.model.embed_tokens.weight).to(self.compute_dtype)
        scale = self.config.arch.embed_scale
        return x.mul_(scale) if scale != 1.0 else x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self._head(hidden)
        o = self.config.arch
        if o.logits_scale != 1.0:
            logits.mul_(o.logits_scale)
        if o.final_softcap is not None:
            logits.div_(o.final_softcap).tanh_().mul_(o.final_softcap)
        return logits

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self._logits_matrix()
        if head is not None and id(head) in self._dense and self._routing is not None:
            b = linear_routing.bucket(hidden.shape[0])
            kernel = self._routing.kernel(*head.shape, head.dtype, b)
            if kernel != "core":
                out = hidden.new_empty((hidden.shape[0], head.shape[0]))
                return linear_routing.apply(kernel, hidden, self._dense[id(head)], None, out)
        if self._row_kernels and isinstance(head, llmcore.PackedWeight):  # one family: dots
            return row_kernels.dot(hidden, head, None,
                                   hidden.new_empty((hidden.shape[0], head.shape[0])))
        if self._tied_packed is not None:
            return linear_packed(hidden, self._tied_packed, None)
        if self.lm_head is not None:
            return self.lm_head(hidden)
        return linear(hidden, self.model.embed_tokens.weight, None, self._widen)

    def pack_weights(self, prepacked: Mapping[str, llmcore.PackedWeight] | None = None) -> None:
        """Moves every matrix into the core's packed layout (CPU, fp32 activations): the
        projections, the experts, the LM head, and a tied embedding (looked up from the
        packed copy, so it is stored once). Call after load_weights.

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
        self._row_plan, self._prompt_copies = None, {}
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
        mats = [m.matrix for m in self.modules() if isinstance(m, Linear)]
        if self.lm_head is None:
            mats.append(self._tied_packed if self._tied_packed is not None
                        else self.model.embed_tokens.weight)
        for w in mats:
            for part in (w.parts if isinstance(w, PackedParts) else (w,)):
                key = str(part.dtype).removeprefix("torch.")
                counts[key] = counts.get(key, 0) + 1
        return counts

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionBackend,
        logits_indices: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [len(logits_indices) or T, vocab] for the selected rows of the batch."""
        hidden = self.hidden_states(input_ids, positions, attn, inputs_embeds)
        if logits_indices is not None:
            hidden = hidden.index_select(0, logits_indices)
        return self.compute_logits(hidden)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies HF-named tensors into our (possibly fused) parameters (weight_map.py).

        Raises if a tensor has no home or a parameter was never written, so a checkpoint
        that does not fit the config fails loudly instead of running on garbage.
        """
        weight_map.load(self, weights)
