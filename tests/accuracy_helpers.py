"""Accuracy measures the tests share: a model's logits over one text, their agreement with
a reference's, and the word error rate of a transcript."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def logits_of(loaded: Any, ids: list[int]) -> torch.Tensor:
    """float32 logits of every position of `ids`, the whole text in one dense pass."""
    from actors.models.attention import DenseCausalAttention

    model = loaded.model
    attn = DenseCausalAttention(model.attention_specs(), [len(ids)])
    with torch.inference_mode():
        return model(torch.tensor(ids), torch.arange(len(ids)), attn).float()


def accuracy(got: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """The largest logit difference and the share of positions whose top token agrees."""
    return {"max_abs": float((got - ref).abs().max()),
            "top1": float((got.argmax(-1) == ref.argmax(-1)).float().mean())}


def _bench_whisper():
    """scripts/bench_whisper.py, whose word error rate the tests share (one definition)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_whisper.py"
    spec = importlib.util.spec_from_file_location("bench_whisper", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


word_error_rate = _bench_whisper().word_error_rate
