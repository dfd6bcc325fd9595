"""The generation service's pooling requests (embeddings): prompts and a PoolingSpec in,
one float32 vector per prompt out.

A pooling request is admitted exactly as a text generation is (`FrontendContext.start`:
admission slots, the request registry, the tokenizer actor's prompt check under pooling's
rule, the engine), and what goes wrong is the same typed `ServiceFailure`
(server.frontend.failures) that each route maps to its envelope. The engine computes the
prompt only and answers each prompt with one vector (ChoiceUpdate.pooled); nothing is
sampled, so there are no deltas to stream.

    pooled = await pool(ctx, request_id, prompts, params, spec)   # ServiceFailure
    pooled.vectors, pooled.prompt_tokens
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from actors.params.pooling import PoolingSpec
from actors.params.sampling import SamplingParams
from actors.runtime.outbox import OutboxFailed
from actors.runtime.request import PromptInput

from server.errors import APIError, failure_of_api_error
from server.frontend.context import FrontendContext
from server.frontend.failures import NOT_SERVING, Unavailable, failure_of

__all__ = ["Pooled", "pool"]


@dataclass(frozen=True, slots=True)
class Pooled:
    """One vector per prompt, in the prompts' order, and the prompt tokens they took."""

    vectors: list[np.ndarray]
    prompt_tokens: int


async def pool(ctx: FrontendContext, request_id: str, prompts: list[PromptInput],
               params: SamplingParams, spec: PoolingSpec) -> Pooled:
    """Admit the prompts as one pooling request and wait for every vector. Raises
    ServiceFailure (as `service.start` and `collect` do); retires the request."""
    gen = ctx.start(request_id, prompts, params, pooling=spec)
    try:
        try:
            await gen.start()
        except APIError as exc:  # the admission still answers in HTTP's terms
            raise failure_of_api_error(exc) from None
        vectors: dict[int, bytes] = {}
        while True:
            try:
                updates = await gen.state.outbox.get()
            except OutboxFailed as exc:
                raise failure_of(exc.error) from None
            if not updates:
                break
            for u in updates:
                if u.pooled is not None:
                    vectors[u.index] = u.pooled
        if len(vectors) != len(prompts):  # aborted (drain): nothing to answer with
            raise Unavailable(NOT_SERVING, retry_after=5)
        tokens = sum(len(r.token_ids) for r in gen.state.prompt_results)
        return Pooled([np.frombuffer(vectors[i], "<f4") for i in range(len(prompts))], tokens)
    finally:
        gen.retire()
