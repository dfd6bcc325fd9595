"""transformers as the correctness and speed baseline for a model we load.

The GGUF path uses transformers' own config reader, tensor-name map, Q/K un-permutation and
dequantization (load_gguf_checkpoint). ``from_pretrained(gguf_file=...)`` wraps the same
functions but also insists on the accelerate package, which we do not need.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["transformers_reference"]


def transformers_reference(source: str | Path, dtype: Any = None) -> Any:
    """A transformers causal LM for a GGUF file or a Hugging Face directory (eval mode)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = dtype or torch.float32
    path = Path(source)
    if path.is_dir():
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    cfg = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    ref = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=ref)["tensors"]
    missing, unexpected = ref.load_state_dict(tensors, strict=False)
    if unexpected or not set(missing) <= {"lm_head.weight"}:
        raise ValueError(f"GGUF tensors do not fit: missing {missing}, unexpected {unexpected}")
    ref.tie_weights()
    return ref
