"""build_model: ModelConfig -> an empty model of the right class, ready for load_weights."""

from __future__ import annotations

import torch

from actors.models.bert import BertModel
from actors.models.config import ModelConfig, UnsupportedModelError
from actors.models.llama import LlamaForCausalLM
from actors.models.whisper import WhisperForConditionalGeneration

# Mistral and Qwen2 differ from Llama only by config flags (sliding window, qkv bias);
# BERT is the encoder family, served for pooling only; Whisper the encoder-decoder, served
# for transcription only.
_ARCHITECTURES: dict[str, type[LlamaForCausalLM] | type[BertModel]
                     | type[WhisperForConditionalGeneration]] = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "bert": BertModel,
    "whisper": WhisperForConditionalGeneration,
}


def build_model(
    cfg: ModelConfig, dtype: torch.dtype = torch.float32, max_positions: int | None = None
) -> LlamaForCausalLM | BertModel | WhisperForConditionalGeneration:
    cls = _ARCHITECTURES.get(cfg.model_type)
    if cls is None:
        raise UnsupportedModelError(f"no model class for model_type {cfg.model_type!r}")
    return cls(cfg, dtype=dtype, max_positions=max_positions).eval()
