"""The Llama family's name for the shared decoder (decoder.py), and the building blocks
other model files import from here."""

from __future__ import annotations

from actors.models.decoder import DecoderForCausalLM
from actors.models.layers import (Linear, RMSNorm, _param, _released, _widening, linear,
                                  linear_packed)

LlamaForCausalLM = DecoderForCausalLM

__all__ = ["DecoderForCausalLM", "Linear", "LlamaForCausalLM", "RMSNorm", "_param", "_released",
           "_widening", "linear", "linear_packed"]
