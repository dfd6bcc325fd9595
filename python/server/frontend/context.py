"""`FrontendContext`: what the generation service needs from the server, typed, and nothing
else (no config object, health flags or HTTP handles).

- `start`: admits one request and returns its `Generation` (admission slots, the request
  registry, the actor system's submit and abort are behind it): a text generation, a
  transcription window (`encoder_input`) or a pooling request (`pooling`);
- `token_texts`: the tokenizer actor's token texts, for logprobs;
- `reaper`: the nursery that releases a request's grammar pin once it has retired;
- `grammar`: the server's bounds on a structured-output constraint (`GrammarBounds`);
- `prepare_grammar` / `release_grammar`: the engine side compiles a constraint, in the
  process that owns the engine core, and pins it until released (the actor system's).

The routes build one per request with `context_of(srv)` (a handful of reads).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import trio
from actors.messages import GrammarVerdict, PrepareGrammar
from actors.params.encoder import EncoderInput
from actors.params.pooling import PoolingSpec
from actors.params.sampling import SamplingParams
from actors.runtime.request import PromptInput
from actors.text.detokenizer import TokenTexts

from server.frontend.generation import Generation

if TYPE_CHECKING:
    from server.state import ServerState


class StartGeneration(Protocol):
    def __call__(self, request_id: str, prompts: list[PromptInput], params: SamplingParams,
                 *, encoder_input: EncoderInput | None = None,
                 pooling: PoolingSpec | None = None) -> Generation: ...


@dataclass(frozen=True, slots=True)
class GrammarBounds:
    """The server's bounds on a constraint, applied before the engine side is asked."""

    max_grammar_bytes: int
    max_grammar_subschemas: int
    max_pending_grammars: int


@dataclass(frozen=True, slots=True)
class FrontendContext:
    start: StartGeneration
    token_texts: TokenTexts
    reaper: trio.Nursery | None
    grammar: Callable[[], GrammarBounds]
    prepare_grammar: Callable[[PrepareGrammar], Awaitable[GrammarVerdict]]
    release_grammar: Callable[[int], None]


def context_of(srv: ServerState) -> FrontendContext:
    """The service's view of a serving server (its actors are up)."""

    def start(request_id: str, prompts: list[PromptInput], params: SamplingParams, *,
              encoder_input: EncoderInput | None = None,
              pooling: PoolingSpec | None = None) -> Generation:
        return Generation(srv, request_id, prompts, params, pooling=pooling,
                          encoder_input=encoder_input)

    def grammar() -> GrammarBounds:
        config = srv.config
        return GrammarBounds(max_grammar_bytes=config.max_grammar_bytes,
                             max_grammar_subschemas=config.max_grammar_subschemas,
                             max_pending_grammars=config.max_pending_grammars)

    async def prepare_grammar(request: PrepareGrammar) -> GrammarVerdict:
        return await srv.actors.prepare_grammar(request)  # type: ignore[union-attr]

    def release_grammar(pin: int) -> None:
        srv.actors.release_grammar(pin)  # type: ignore[union-attr]

    return FrontendContext(start=start, token_texts=srv.token_texts, reaper=srv.reaper,
                           grammar=grammar, prepare_grammar=prepare_grammar,
                           release_grammar=release_grammar)
