"""Checkpoint tensors -> a decoder's parameters.

Checkpoints name tensors as transformers does. Ours differ in three ways: q/k/v and
gate/up are fused (``qkv_proj``, ``gate_up_proj``: each part fills a slice of rows), a
family may use other names for the same modules (Mixtral's ``block_sparse_moe``, its
experts' ``w1``/``w3``/``w2``: families/*.py ``renames``), and a norm that scales by
(1 + w) (Gemma) stores the 1 folded in. Phi-3 ships q/k/v and gate/up already fused, under
our own names.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from actors.models.families import family
from actors.models.layers import RMSNorm

if TYPE_CHECKING:
    from actors.models.decoder import DecoderForCausalLM

# HF name fragment -> (our fused parameter fragment, shard index within it)
FUSED = {
    ".q_proj.": (".qkv_proj.", 0),
    ".k_proj.": (".qkv_proj.", 1),
    ".v_proj.": (".qkv_proj.", 2),
    ".gate_proj.": (".gate_up_proj.", 0),
    ".up_proj.": (".gate_up_proj.", 1),
}


def our_name(model_type: str, hf_name: str) -> tuple[str | None, int | None]:
    """(our parameter name, shard index within a fused one or None) for a checkpoint name;
    (None, None) for a tensor the family does not run (a vision tower's)."""
    fam = family(model_type)
    if fam is not None and any(s in hf_name for s in fam.skips):
        return None, None
    name = hf_name
    for old, new in (fam.renames if fam is not None else ()):
        name = name.replace(old, new)
    for frag, (fused, idx) in FUSED.items():
        if frag in name:
            return name.replace(frag, fused), idx
    return name, None


def shard_range(model: DecoderForCausalLM, name: str, shard: int) -> tuple[int, int]:
    c = model.config
    if ".qkv_proj." in name:
        sizes = [c.q_size, c.kv_size, c.kv_size]
    elif ".experts." in name:
        assert c.arch.moe is not None
        sizes = [c.arch.moe.intermediate_size] * 2
    else:
        sizes = [c.intermediate_size, c.intermediate_size]
    return sum(sizes[:shard]), sizes[shard]


@torch.no_grad()
def load(model: DecoderForCausalLM, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    params = dict(model.named_parameters(remove_duplicate=False))
    norms = {f"{n}.weight": m for n, m in model.named_modules() if isinstance(m, RMSNorm)}
    written: set[str] = set()
    c = model.config
    for hf_name, tensor in weights:
        if "rotary_emb.inv_freq" in hf_name:
            continue
        if hf_name == "lm_head.weight" and c.tie_word_embeddings:
            continue  # some checkpoints store the tied copy as well
        name, shard = our_name(c.model_type, hf_name)
        if name is None:
            continue
        if name not in params:
            raise KeyError(f"checkpoint tensor {hf_name!r} has no matching parameter")
        dst = params[name]
        if shard is not None:
            dst = dst.narrow(0, *shard_range(model, name, shard))
        if tuple(dst.shape) != tuple(tensor.shape):
            raise ValueError(
                f"{hf_name}: checkpoint shape {tuple(tensor.shape)} "
                f"!= expected {tuple(dst.shape)}"
            )
        if name in norms:
            tensor = norms[name].fold_offset(tensor)
        dst.copy_(tensor)
        written.add(name if shard is None else f"{name}#{shard}")
    check_complete(model, written)


def check_complete(model: DecoderForCausalLM, written: set[str]) -> None:
    missing = []
    for name, _ in model.named_parameters():
        if ".qkv_proj." in name and name not in written:
            parts = [f"{name}#{i}" for i in range(3)]
        elif ".gate_up_proj." in name and name not in written:
            parts = [f"{name}#{i}" for i in range(2)]
        else:
            parts = [name]
        missing += [p for p in parts if p not in written]
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ValueError(f"checkpoint lacks {len(missing)} tensors: {shown}")
