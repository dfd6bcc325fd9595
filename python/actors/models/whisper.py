"""WhisperForConditionalGeneration: OpenAI's Whisper encoder-decoder (speech to text).

Two halves that run at different times:

- ``encode(features)``: log-mel features [B, n_mels, 3000] (one 30 s window each) ->
  encoder states [B, 1500, d]. Two conv1d + GELU (the second with stride 2), sinusoidal
  positions, pre-LN transformer blocks with bidirectional attention, a final LayerNorm.
  ``cross_kv(states)`` projects them once into every decoder layer's cross-attention K/V.
  The runner does both on a sequence's first step and keeps the K/V until it finishes.
- the decoder, over the same flattened batch as the Llama family (input_ids [T],
  positions [T]): token + learned position embeddings, pre-LN blocks of causal self-
  attention (through the runner's ``AttentionBackend``, so its KV lives in the paged
  cache like any decoder's), cross-attention (``attn.cross_attn(layer, q)``: the backend
  knows which rows belong to which sequence and holds their encoder K/V), GELU MLP, a
  final LayerNorm, and logits through the token embedding (tied).

q/k/v of self-attention are stored fused ([3d, d]; Whisper's k projection has no bias,
so that slice of the fused bias is zero), as are the cross-attention k/v ([2d, d]).
``load_weights`` takes Hugging Face names (``model.encoder.layers.0.self_attn.q_proj.
weight``...); the CTranslate2 reader (loader/ct2.py) maps its names onto those.

Weights follow the engine's dtype as the Llama family's do: bf16 matrices multiply fp32
activations through ``llmcore.linear`` on the CPU; the convolutions, position tables and
norms are kept in the activation dtype (small, and F.conv1d wants one dtype).
"""

from __future__ import annotations

from typing import Any

from collections.abc import Iterable
from typing import Protocol

import llmcore
import torch
import torch.nn.functional as F
from torch import nn

from actors.loader.weights import Place, load_checkpoint
from actors.models.attention import AttentionBackend, LayerAttentionSpec
from actors.models.config import ModelConfig
from actors.models.llama import Linear, _param, _released, _widening, linear, linear_packed

__all__ = ["CrossKV", "EncoderDecoderAttention", "WhisperForConditionalGeneration"]

N_FRAMES = 3000  # mel frames of one 30 s window (hop 160 at 16 kHz)

# one decoder layer's cross-attention keys and values for one sequence:
# k, v [num_heads, encoder positions, head_dim]
CrossKV = list[tuple[torch.Tensor, torch.Tensor]]


class EncoderDecoderAttention(AttentionBackend, Protocol):
    def cross_attn(self, layer_idx: int, q: torch.Tensor) -> torch.Tensor:
        """q [T, num_heads, head_dim] -> out [T, num_heads, head_dim]: each row attends
        over the encoder states of its own sequence (no mask, no cache write)."""
        ...


class _LayerNorm(nn.Module):
    def __init__(self, size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = _param(size, dtype=dtype)
        self.bias = _param(size, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, 1e-5)


class _EncoderLayer(nn.Module):
    def __init__(self, d: int, ffn: int, dtype: torch.dtype, compute: torch.dtype) -> None:
        super().__init__()
        self.attn_norm = _LayerNorm(d, compute)
        self.qkv = Linear(d, 3 * d, True, dtype, compute)
        self.out = Linear(d, d, True, dtype, compute)
        self.mlp_norm = _LayerNorm(d, compute)
        self.fc1 = Linear(d, ffn, True, dtype, compute)
        self.fc2 = Linear(ffn, d, True, dtype, compute)


class _DecoderLayer(nn.Module):
    def __init__(self, d: int, ffn: int, dtype: torch.dtype, compute: torch.dtype) -> None:
        super().__init__()
        self.attn_norm = _LayerNorm(d, compute)
        self.qkv = Linear(d, 3 * d, True, dtype, compute)
        self.out = Linear(d, d, True, dtype, compute)
        self.cross_norm = _LayerNorm(d, compute)
        self.cross_q = Linear(d, d, True, dtype, compute)
        self.cross_kv = Linear(d, 2 * d, True, dtype, compute)
        self.cross_out = Linear(d, d, True, dtype, compute)
        self.mlp_norm = _LayerNorm(d, compute)
        self.fc1 = Linear(d, ffn, True, dtype, compute)
        self.fc2 = Linear(ffn, d, True, dtype, compute)


def _flat(lin: Linear, x: torch.Tensor) -> torch.Tensor:
    """A Linear over the last dimension of any-rank x (the core's kernels take 2-D)."""
    return lin(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)


class WhisperForConditionalGeneration(nn.Module):
    is_causal = True
    is_encoder_decoder = True

    @staticmethod
    def decoding_hook(config: ModelConfig) -> Any:
        """Whisper's banned tokens, timestamp rules and input checks (models/hooks.py)."""
        from actors.models.whisper_rules import WhisperHook

        return WhisperHook(config)

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
                 max_positions: int | None = None,
                 compute_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        del max_positions  # the learned position table is the checkpoint's (448)
        if compute_dtype is None:
            compute_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
        self.config = cfg
        self.dtype, self.compute_dtype = dtype, compute_dtype
        self._widen = _widening(dtype, compute_dtype)
        x = cfg.extra
        d, n_mels = cfg.hidden_size, int(x["num_mel_bins"])
        self.n_mels = n_mels
        self.encoder_heads = int(x["encoder_heads"])
        self.encoder_positions = int(x["encoder_positions"])
        enc_ffn = int(x["encoder_ffn_dim"])
        self.conv1_w = _param(d, n_mels, 3, dtype=compute_dtype)
        self.conv1_b = _param(d, dtype=compute_dtype)
        self.conv2_w = _param(d, d, 3, dtype=compute_dtype)
        self.conv2_b = _param(d, dtype=compute_dtype)
        self.enc_pos = _param(self.encoder_positions, d, dtype=compute_dtype)
        self.enc_layers = nn.ModuleList(_EncoderLayer(d, enc_ffn, dtype, compute_dtype)
                                        for _ in range(int(x["encoder_layers"])))
        self.enc_norm = _LayerNorm(d, compute_dtype)
        self.embed = _param(cfg.vocab_size, d, dtype=dtype)
        self.dec_pos = _param(cfg.max_position_embeddings, d, dtype=compute_dtype)
        self.dec_layers = nn.ModuleList(_DecoderLayer(d, cfg.intermediate_size, dtype,
                                                      compute_dtype)
                                        for _ in range(cfg.num_layers))
        self.dec_norm = _LayerNorm(d, compute_dtype)
        self._tied_packed: llmcore.PackedWeight | None = None

    def attention_specs(self) -> list[LayerAttentionSpec]:
        c = self.config
        return [LayerAttentionSpec(c.num_heads, c.num_heads, c.head_dim, c.head_dim**-0.5, None)
                for _ in range(c.num_layers)]

    # ------------------------------------------------------------------ encoder

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        """[B, n_mels, 3000] log-mel -> encoder states [B, 1500, d]."""
        if features.dim() != 3 or features.shape[1] != self.n_mels:
            raise ValueError(f"features must be [B, {self.n_mels}, frames], got "
                             f"{tuple(features.shape)}")
        x = features.to(self.compute_dtype)
        x = F.gelu(F.conv1d(x, self.conv1_w, self.conv1_b, padding=1))
        x = F.gelu(F.conv1d(x, self.conv2_w, self.conv2_b, stride=2, padding=1))
        x = x.transpose(1, 2)  # [B, frames/2, d]
        n = x.shape[1]
        if n > self.encoder_positions:
            raise ValueError(f"{features.shape[2]} frames exceed the encoder's "
                             f"{2 * self.encoder_positions}")
        x = (x + self.enc_pos[:n]).contiguous()
        b, d, heads = x.shape[0], x.shape[2], self.encoder_heads
        hd = d // heads
        for layer in self.enc_layers:
            h = layer.attn_norm(x)
            q, k, v = _flat(layer.qkv, h).view(b, n, 3, heads, hd).permute(2, 0, 3, 1, 4)
            o = F.scaled_dot_product_attention(q, k, v, scale=hd**-0.5)
            x = x + _flat(layer.out, o.transpose(1, 2).reshape(b, n, d))
            x = x + _flat(layer.fc2, F.gelu(_flat(layer.fc1, layer.mlp_norm(x))))
        return self.enc_norm(x)

    def cross_kv(self, states: torch.Tensor) -> list[CrossKV]:
        """Encoder states [B, S, d] -> per sequence, per decoder layer, (k, v) each
        [heads, S, head_dim] (contiguous: they are kept for the sequence's lifetime)."""
        c = self.config
        b, s, _ = states.shape
        out: list[CrossKV] = [[] for _ in range(b)]
        for layer in self.dec_layers:
            kv = _flat(layer.cross_kv, states).view(b, s, 2, c.num_heads, c.head_dim)
            kv = kv.permute(0, 2, 3, 1, 4)  # [B, 2, heads, S, hd]
            for i in range(b):
                out[i].append((kv[i, 0].contiguous(), kv[i, 1].contiguous()))
        return out

    # ------------------------------------------------------------------ decoder

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor,
                      attn: EncoderDecoderAttention) -> torch.Tensor:
        """Final-norm decoder states [T, d] for the flattened batch."""
        c = self.config
        t, heads, hd = input_ids.shape[0], c.num_heads, c.head_dim
        x = self._embed(input_ids) + self.dec_pos[positions]
        for i, layer in enumerate(self.dec_layers):
            q, k, v = layer.qkv(layer.attn_norm(x)).view(t, 3, heads, hd).unbind(1)
            o = attn.attn(i, q.contiguous(), k.contiguous(), v.contiguous())
            x = x + layer.out(o.reshape(t, -1))
            cq = layer.cross_q(layer.cross_norm(x)).view(t, heads, hd).contiguous()
            x = x + layer.cross_out(attn.cross_attn(i, cq).reshape(t, -1))
            x = x + layer.fc2(F.gelu(layer.fc1(layer.mlp_norm(x))))
        return self.dec_norm(x)

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self._tied_packed is not None:
            out = torch.empty((input_ids.shape[0], self.config.hidden_size),
                              dtype=self.compute_dtype)
            return self._tied_packed.rows(input_ids.numpy(), out)
        return F.embedding(input_ids, self.embed).to(self.compute_dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._tied_packed is not None:
            return linear_packed(hidden, self._tied_packed, None)
        return linear(hidden, self.embed, None, self._widen)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: EncoderDecoderAttention,
                logits_indices: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.hidden_states(input_ids, positions, attn)
        if logits_indices is not None:
            hidden = hidden.index_select(0, logits_indices)
        return self.compute_logits(hidden)

    # ------------------------------------------------------------------ weights

    def pack_weights(self) -> None:
        """The projections and the tied embedding into the core's packed layout (CPU,
        fp32 activations, not the scalar ISA), as the Llama family's."""
        if (self.compute_dtype != torch.float32 or self.embed.is_cuda
                or llmcore.linear_isa() == "scalar"):
            return
        for mod in self.modules():
            if isinstance(mod, Linear) and mod.packed is None:
                mod.pack()
        if self._tied_packed is None:
            self._tied_packed = llmcore.PackedWeight(self.embed.detach())
            self.embed = _released(self.embed)

    # HF name inside a layer -> (our module, fused shard or None)
    _ENC = {"self_attn.q_proj": ("qkv", 0), "self_attn.k_proj": ("qkv", 1),
            "self_attn.v_proj": ("qkv", 2), "self_attn.out_proj": ("out", None),
            "self_attn_layer_norm": ("attn_norm", None), "fc1": ("fc1", None),
            "fc2": ("fc2", None), "final_layer_norm": ("mlp_norm", None)}
    _DEC = {**_ENC, "encoder_attn.q_proj": ("cross_q", None),
            "encoder_attn.k_proj": ("cross_kv", 0), "encoder_attn.v_proj": ("cross_kv", 1),
            "encoder_attn.out_proj": ("cross_out", None),
            "encoder_attn_layer_norm": ("cross_norm", None)}
    _TOP = {"model.encoder.conv1.weight": "conv1_w", "model.encoder.conv1.bias": "conv1_b",
            "model.encoder.conv2.weight": "conv2_w", "model.encoder.conv2.bias": "conv2_b",
            "model.encoder.embed_positions.weight": "enc_pos",
            "model.encoder.layer_norm.weight": "enc_norm.weight",
            "model.encoder.layer_norm.bias": "enc_norm.bias",
            "model.decoder.embed_tokens.weight": "embed",
            "model.decoder.embed_positions.weight": "dec_pos",
            "model.decoder.layer_norm.weight": "dec_norm.weight",
            "model.decoder.layer_norm.bias": "dec_norm.bias"}

    def _our_name(self, hf_name: str) -> Place | None:
        hf = hf_name.removeprefix("model.") if hf_name.startswith("model.model.") else hf_name
        if hf in self._TOP:
            return self._TOP[hf], None
        for prefix, ours, table in (("model.encoder.layers.", "enc_layers", self._ENC),
                                    ("model.decoder.layers.", "dec_layers", self._DEC)):
            if hf.startswith(prefix):
                index, _, rest = hf.removeprefix(prefix).partition(".")
                module, _, leaf = rest.rpartition(".")
                hit = table.get(module)
                if hit is not None:
                    return f"{ours}.{index}.{hit[0]}.{leaf}", hit[1]
        return None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies HF-named tensors in (loader/weights.py; ``proj_out.weight``, the tied
        copy, is skipped). Raises on a tensor with no home, a shape that does not fit, or
        a parameter never written; a fused q/k/v bias whose k part is absent (Whisper
        has none) is zero."""
        d = self.config.hidden_size

        def parts(name: str) -> tuple[int, ...] | None:
            if ".qkv." in name:
                return d, d, d
            return (d, d) if ".cross_kv." in name else None

        def absent_zero(name: str) -> tuple[int, ...]:
            # Whisper's k projections have no bias: the k slice of a fused bias is zero.
            if name.endswith(".qkv.bias"):
                return (1,)
            return (0,) if name.endswith(".cross_kv.bias") else ()

        load_checkpoint(self, weights, self._our_name, parts,
                        skip=lambda hf: hf == "proj_out.weight", absent_zero=absent_zero)
