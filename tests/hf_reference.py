"""transformers as the correctness oracle for the default GGUF model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def gguf_reference(path: Path) -> Any:
    """transformers' own GGUF path: its config reader, tensor-name map, Q/K un-permutation
    and dequantization (load_gguf_checkpoint). from_pretrained(gguf_file=...) wraps the same
    functions but additionally insists on the accelerate package, which we do not need."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    cfg = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    ref = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=ref)["tensors"]
    missing, unexpected = ref.load_state_dict(tensors, strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}  # lm_head is tied
    ref.tie_weights()
    return ref
