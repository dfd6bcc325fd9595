"""`FrontendContext`: what the generation service needs from the server, typed, and nothing
else (no config object, health flags or HTTP handles).

- `start`: admits one request and returns its `Generation` (admission slots, the request
  registry, the actor system's submit and abort are behind it): a text generation, a
  transcription window (`encoder_input`) or a pooling request (`pooling`);
- `token_texts`: the tokenizer actor's token texts, for logprobs;
- `reaper`: the nursery that releases a request's grammar pin once it has retired;
- `grammar`: what compiling a structured-output constraint needs (`GrammarFacts`).

The routes build one per request with `context_of(srv)` (a handful of reads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import trio
from actors.params.encoder import EncoderInput
from actors.params.pooling import PoolingSpec
from actors.params.sampling import SamplingParams
from actors.runtime.request import PromptInput
from actors.text.detokenizer import TokenTexts

from server.frontend.generation import Generation

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from server.state import ServerState


class StartGeneration(Protocol):
    def __call__(self, request_id: str, prompts: list[PromptInput], params: SamplingParams,
                 *, encoder_input: EncoderInput | None = None,
                 pooling: PoolingSpec | None = None) -> Generation: ...


@dataclass(frozen=True, slots=True)
class GrammarFacts:
    """The model's and the server's facts a grammar compiles against."""

    model_dir: str
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    tokenizer: PreTrainedTokenizerBase
    default_backend: str
    max_grammar_bytes: int
    max_grammar_subschemas: int
    max_pending_grammars: int


@dataclass(frozen=True, slots=True)
class FrontendContext:
    start: StartGeneration
    token_texts: TokenTexts
    reaper: trio.Nursery | None
    grammar: Callable[[], GrammarFacts]


def context_of(srv: ServerState) -> FrontendContext:
    """The service's view of a serving server (its actors are up)."""

    def start(request_id: str, prompts: list[PromptInput], params: SamplingParams, *,
              encoder_input: EncoderInput | None = None,
              pooling: PoolingSpec | None = None) -> Generation:
        return Generation(srv, request_id, prompts, params, pooling=pooling,
                          encoder_input=encoder_input)

    def grammar() -> GrammarFacts:
        info, config = srv.actors.info, srv.config  # type: ignore[union-attr]
        return GrammarFacts(
            model_dir=info.model_dir, vocab_size=info.vocab_size,
            eos_token_ids=tuple(info.eos_token_ids), tokenizer=srv.tokenizer,
            default_backend=config.engine.structured_outputs_backend,
            max_grammar_bytes=config.max_grammar_bytes,
            max_grammar_subschemas=config.max_grammar_subschemas,
            max_pending_grammars=config.max_pending_grammars)

    return FrontendContext(start=start, token_texts=srv.token_texts, reaper=srv.reaper,
                           grammar=grammar)
