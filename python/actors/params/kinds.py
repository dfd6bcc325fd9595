"""Request kinds: what one ``Admit`` asks of the core, as a tagged union.

    RequestKind = Generate | Pool | Transcribe

Each kind carries its own parameters and nothing of the others', so the core routes by
kind (``match admit.kind``) instead of testing optional fields:

- ``Generate``: ``params.n`` choices drawn under ``params``, optionally under a LoRA
  adapter (its id in the core's registry; 0: the base model; part of the prefix-cache
  key, so blocks are never shared across adapters), optionally from a prompt given as
  embedding rows (``prompt_embeds``, actors.params.embeds; the Admit's token ids are then
  placeholders, one per row).
- ``Pool``: the prompt computed once, no token drawn, one vector out
  (``RequestOutput.pooled``), shaped by its ``PoolingSpec``. Truncation happened in the
  front end, and the priority travels on the Admit, so it needs no SamplingParams.
- ``Transcribe``: an encoder-decoder window (Whisper): the decoder's prompt is the
  Admit's tokens, the encoder's input rides here; one choice.

Every kind answers ``params``: the SamplingParams its sequence runs under (a fixed one for
``Pool``: one choice, nothing drawn), so the scheduler's bookkeeping is the same for all.
All three are frozen plain data: they cross the process boundary pickled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from actors.params.encoder import EncoderInput
from actors.params.pooling import PoolingSpec
from actors.params.sampling import SamplingParams

if TYPE_CHECKING:  # numpy: the scheduler's modules import this one without it
    from actors.params.embeds import PromptEmbeds

__all__ = ["POOL_SAMPLING", "Generate", "Pool", "RequestKind", "Transcribe", "request_kind"]

# What a pooling sequence runs under: one choice, which ends when its prompt has run.
POOL_SAMPLING = SamplingParams(max_tokens=1)


@dataclass(frozen=True, slots=True)
class Generate:
    params: SamplingParams
    lora_id: int = 0
    prompt_embeds: PromptEmbeds | None = None


@dataclass(frozen=True, slots=True)
class Pool:
    spec: PoolingSpec = field(default_factory=PoolingSpec)

    @property
    def params(self) -> SamplingParams:
        return POOL_SAMPLING


@dataclass(frozen=True, slots=True)
class Transcribe:
    params: SamplingParams
    encoder_input: EncoderInput


RequestKind = Generate | Pool | Transcribe


def request_kind(params: SamplingParams, pooling: PoolingSpec | None = None,
                 encoder_input: EncoderInput | None = None,
                 prompt_embeds: PromptEmbeds | None = None) -> RequestKind:
    """The kind a front-end request names (its params, pooling spec, encoder input, the
    embeddings its prompt is given as)."""
    if pooling is not None:
        return Pool(pooling)
    if encoder_input is not None:
        return Transcribe(params, encoder_input)
    return Generate(params, params.lora_id, prompt_embeds)
