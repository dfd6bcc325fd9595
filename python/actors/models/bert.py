"""BertModel: the BERT encoder family (sentence-transformers' MiniLM, BGE, E5 ...) for
pooling, over the same flattened batch as the decoders.

Every scheduled token of every sequence is one row: input_ids [T], positions [T] ->
hidden [T, hidden_size], the last layer's output (what sentence-transformers pools).
Attention is bidirectional within a sequence, so it goes through the runner's encoder
seam (``is_causal`` False: every prompt runs whole in one step and no KV is kept); there
is no LM head, only ``hidden_states``.

Post-LayerNorm blocks as in the original: x = LN(x + attn(x)); x = LN(x + FFN(x)), with
exact (erf) GELU; token type 0 for every row (one text per sequence) unless the runner
passes ``token_type_ids`` (a cross-encoder's text pairs). q/k/v are stored fused as one
[3 * hidden, hidden] matrix; ``load_weights`` takes Hugging Face names (with or without a
``bert.`` prefix; the pooler head and MLM heads are skipped; a classifier's pooler and
``classifier`` go to its ClassifierHead, actors.models.classifier).

Weights stay float32 on the CPU whatever ``--dtype`` says: an encoder of this size is
bound by arithmetic, not by reading its weights, and the parity with sentence-
transformers (cosine >= 0.9999) is asserted in float32. On the CPU the projections run
through the core's packed kernels (``pack_weights``), as the decoders' do.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from actors.loader.weights import Place, load_checkpoint
from actors.models.attention import AttentionBackend
from actors.models.config import ModelConfig
from actors.models.llama import Linear, _param

__all__ = ["BertModel"]


class _LayerNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _param(size, dtype=dtype)
        self.bias = _param(size, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class _Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.qkv = Linear(h, 3 * h, True, dtype)
        self.attn_out = Linear(h, h, True, dtype)
        self.attn_norm = _LayerNorm(h, eps, dtype)
        self.up = Linear(h, cfg.intermediate_size, True, dtype)
        self.down = Linear(cfg.intermediate_size, h, True, dtype)
        self.out_norm = _LayerNorm(h, eps, dtype)


class BertModel(nn.Module):
    is_causal = False

    # HF name fragment inside "encoder.layer.{i}." -> (our name, q/k/v shard or None)
    _NAMES: ClassVar[dict[str, tuple[str, int | None]]] = {
        "attention.self.query.": ("qkv.", 0),
        "attention.self.key.": ("qkv.", 1),
        "attention.self.value.": ("qkv.", 2),
        "attention.output.dense.": ("attn_out.", None),
        "attention.output.LayerNorm.": ("attn_norm.", None),
        "intermediate.dense.": ("up.", None),
        "output.dense.": ("down.", None),
        "output.LayerNorm.": ("out_norm.", None),
    }
    # HF names outside the layers -> ours
    _TOP: ClassVar[dict[str, str]] = {"embeddings.word_embeddings.weight": "word",
                                      "embeddings.position_embeddings.weight": "position",
                                      "embeddings.token_type_embeddings.weight": "token_type",
                                      "embeddings.LayerNorm.weight": "embed_norm.weight",
                                      "embeddings.LayerNorm.bias": "embed_norm.bias"}

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
                 max_positions: int | None = None) -> None:
        super().__init__()
        del max_positions  # the position table is the checkpoint's
        dtype = torch.float32 if dtype == torch.bfloat16 else dtype  # see the module doc
        self.config = cfg
        self.dtype = self.compute_dtype = dtype
        h = cfg.hidden_size
        self.word = _param(cfg.vocab_size, h, dtype=dtype)
        self.position = _param(int(cfg.extra["position_table"]), h, dtype=dtype)
        self.token_type = _param(int(cfg.extra["type_vocab_size"]), h, dtype=dtype)
        self.embed_norm = _LayerNorm(h, cfg.rms_norm_eps, dtype)
        self.layers = nn.ModuleList(_Layer(cfg, dtype) for _ in range(cfg.num_layers))

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor,
                      attn: AttentionBackend, token_type_ids: torch.Tensor | None = None
                      ) -> torch.Tensor:
        """The last layer's hidden states [T, hidden_size] for the flattened batch;
        ``token_type_ids`` [T] (a cross-encoder's text pairs), else type 0 for every row."""
        c = self.config
        t, heads, hd = input_ids.shape[0], c.num_heads, c.head_dim
        types = (self.token_type[0] if token_type_ids is None
                 else F.embedding(token_type_ids, self.token_type))
        x = F.embedding(input_ids, self.word) + F.embedding(positions, self.position) + types
        x = self.embed_norm(x)
        for i, layer in enumerate(self.layers):
            q, k, v = layer.qkv(x).view(t, 3, heads, hd).unbind(1)
            o = attn.attn(i, q.contiguous(), k.contiguous(), v.contiguous()).reshape(t, -1)
            x = layer.attn_norm(x + layer.attn_out(o))
            x = layer.out_norm(x + layer.down(F.gelu(layer.up(x))))
        return x

    def pack_weights(self) -> None:
        """The projections into the core's packed layout (CPU, fp32, not the scalar ISA)."""
        import llmcore

        if self.word.is_cuda or llmcore.linear_isa() == "scalar":
            return
        for mod in self.modules():
            if isinstance(mod, Linear) and mod.packed is None:
                mod.pack()

    @staticmethod
    def _hf_name(hf_name: str) -> str:
        name = hf_name.removeprefix("bert.")
        return name.replace(".gamma", ".weight").replace(".beta", ".bias")

    def _our_name(self, hf_name: str) -> Place | None:
        name = self._hf_name(hf_name)
        if name in self._TOP:
            return self._TOP[name], None
        if name.startswith("encoder.layer."):
            index, _, rest = name.removeprefix("encoder.layer.").partition(".")
            for frag, (dst, shard) in self._NAMES.items():
                if rest.startswith(frag):
                    return f"layers.{index}.{dst}{rest[len(frag):]}", shard
        return None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies HF-named tensors in (loader/weights.py); raises on a tensor with no
        home, a shape that does not fit, or a parameter never written."""
        h = self.config.hidden_size

        def skip(hf_name: str) -> bool:  # heads sentence embeddings do not use; a buffer
            name = self._hf_name(hf_name)
            return name.startswith(("pooler.", "cls.")) or name.endswith("position_ids")

        load_checkpoint(self, weights, self._our_name,
                        lambda name: (h, h, h) if ".qkv." in name else None, skip=skip)
