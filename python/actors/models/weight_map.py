"""Checkpoint tensors -> a decoder's parameters.

Checkpoints name tensors as transformers does. Ours differ in three ways: q/k/v and
gate/up are fused (``qkv_proj``, ``gate_up_proj``: each part fills a slice of rows), a
family may use other names for the same modules (Mixtral's ``block_sparse_moe``, its
experts' ``w1``/``w3``/``w2``: families/*.py ``renames``), and a norm that scales by
(1 + w) (Gemma) stores the 1 folded in. Phi-3 ships q/k/v and gate/up already fused, under
our own names. This module says how the names map; the copy, the shape checks and the
check that nothing was left unwritten are loader/weights.py's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from actors.loader.weights import load_checkpoint
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


def skipped(model_type: str, hf_name: str, tied: bool) -> bool:
    """Whether a checkpoint tensor is one the model does not load: rotary tables, the
    stored copy of a tied LM head, a tensor the family does not run (a vision tower's)."""
    if "rotary_emb.inv_freq" in hf_name:
        return True
    if hf_name == "lm_head.weight" and tied:
        return True  # some checkpoints store the tied copy as well
    fam = family(model_type)
    return fam is not None and any(s in hf_name for s in fam.skips)


def our_name(model_type: str, hf_name: str) -> tuple[str, int | None]:
    """(our parameter name, shard index within a fused one or None) for a checkpoint name."""
    fam = family(model_type)
    name = hf_name
    for old, new in (fam.renames if fam is not None else ()):
        name = name.replace(old, new)
    for frag, (fused, idx) in FUSED.items():
        if frag in name:
            return name.replace(frag, fused), idx
    return name, None


def part_rows(model: DecoderForCausalLM, name: str) -> tuple[int, ...] | None:
    """The rows of each part of a fused parameter (q/k/v, gate/up, an expert's gate/up);
    None for one that is not fused."""
    c = model.config
    if ".qkv_proj." in name:
        return c.q_size, c.kv_size, c.kv_size
    if ".gate_up_proj." in name:
        if ".experts." in name:
            assert c.arch.moe is not None
            return (c.arch.moe.intermediate_size,) * 2
        return (c.intermediate_size,) * 2
    return None


def load(model: DecoderForCausalLM, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    c = model.config
    norms = {f"{n}.weight": m for n, m in model.named_modules() if isinstance(m, RMSNorm)}

    def convert(name: str, tensor: torch.Tensor) -> torch.Tensor:
        return norms[name].fold_offset(tensor) if name in norms else tensor

    load_checkpoint(model, weights, lambda hf: our_name(c.model_type, hf),
                    lambda name: part_rows(model, name),
                    skip=lambda hf: skipped(c.model_type, hf, c.tie_word_embeddings),
                    convert=convert)
