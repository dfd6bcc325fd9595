"""The mixture-of-experts decoders: Qwen3-MoE (q/k norm per head, router softmax, top-k,
renormalised when norm_topk_prob; dense MLP layers where mlp_only_layers or
decoder_sparse_step say) and Mixtral (Mistral with every MLP sparse, top-k renormalised).
Mixtral's checkpoint names (block_sparse_moe, w1/w3/w2) map onto Qwen's (mlp, gate/up/down)."""

from __future__ import annotations

from typing import Any

from actors.models.arch import DecoderOptions, MoEOptions
from actors.models.families import Family


def _qwen3_moe(hf: dict[str, Any], num_layers: int) -> tuple[DecoderOptions, dict[str, Any]]:
    experts = int(hf.get("num_experts") or hf["num_local_experts"])  # transformers 5 renamed it
    step = int(hf.get("decoder_sparse_step", 1) or 1)
    dense = set(hf.get("mlp_only_layers") or ())
    layers = tuple(i not in dense and experts > 0 and (i + 1) % step == 0
                   for i in range(num_layers))
    moe = MoEOptions(experts, int(hf["num_experts_per_tok"]), int(hf["moe_intermediate_size"]),
                     bool(hf.get("norm_topk_prob", False)), layers)
    return (DecoderOptions(qk_norm="head", moe=moe),
            {"qkv_bias": bool(hf.get("attention_bias", False))})


def _mixtral(hf: dict[str, Any], num_layers: int) -> tuple[DecoderOptions, dict[str, Any]]:
    moe = MoEOptions(int(hf["num_local_experts"]), int(hf["num_experts_per_tok"]),
                     int(hf["intermediate_size"]), True, (True,) * num_layers)
    return DecoderOptions(moe=moe), {}


FAMILIES = (
    Family(("qwen3_moe",), _qwen3_moe),
    Family(("mixtral",), _mixtral, renames=(
        (".block_sparse_moe.gate.", ".mlp.gate."),
        (".block_sparse_moe.experts.", ".mlp.experts."),
        (".w1.", ".gate_proj."), (".w3.", ".up_proj."), (".w2.", ".down_proj."),
    )),
)
