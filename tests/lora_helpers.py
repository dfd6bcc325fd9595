"""PEFT adapters for the default model, made with ``peft`` on the transformers reference."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import torch

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(reference: Any, out_dir: Path, *, seed: int, rank: int, alpha: int,
                 targets: list[str], rslora: bool = False, b_scale: float = 0.3) -> Any:
    """Saves a randomly initialised adapter (nonzero B) to out_dir; returns the reference
    with the adapter merged (the oracle)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    cfg = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets,
                     init_lora_weights=False, use_rslora=rslora)
    with warnings.catch_warnings():  # peft: deprecated transformers names, no hub config
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(copy.deepcopy(reference), cfg)
        with torch.no_grad():  # peft's random B is large for a 135M model: keep it sane
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.mul_(b_scale)
        peft_model.save_pretrained(str(out_dir))
        return peft_model.merge_and_unload().eval()
