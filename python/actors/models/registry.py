"""build_model: ModelConfig -> an empty model of the right class, ready for load_weights."""

from __future__ import annotations

import torch

from actors.models.bert import BertModel
from actors.models.config import ModelConfig, UnsupportedModelError
from actors.models.decoder import DecoderForCausalLM
from actors.models.families import SUPPORTED_MODEL_TYPES
from actors.models.whisper import WhisperForConditionalGeneration

# Every causal decoder family is one class composed from its options (families/); BERT is
# the encoder family, served for pooling only; Whisper the encoder-decoder, served for
# transcription only.
_ARCHITECTURES: dict[str, type[DecoderForCausalLM] | type[BertModel]
                     | type[WhisperForConditionalGeneration]] = {
    **{t: DecoderForCausalLM for t in SUPPORTED_MODEL_TYPES},
    "bert": BertModel,
    "whisper": WhisperForConditionalGeneration,
}


def build_model(
    cfg: ModelConfig, dtype: torch.dtype = torch.float32, max_positions: int | None = None
) -> DecoderForCausalLM | BertModel | WhisperForConditionalGeneration:
    cls = _ARCHITECTURES.get(cfg.model_type)
    if cls is None:
        raise UnsupportedModelError(f"no model class for model_type {cfg.model_type!r}")
    return cls(cfg, dtype=dtype, max_positions=max_positions).eval()
