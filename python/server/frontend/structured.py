"""A request's output constraint, compiled before admission: ``compile_spec``.

The spec (``SamplingParams.structured``) is compiled through the process's shared
``GrammarCache`` on the cache's worker threads, bounded in time, while the event loop only
waits; a spec the backend refuses is refused naming its field before the request takes a
slot, and an in-process engine core then finds the grammar compiled (a cache hit). Requests
without a constraint never come here.

The server's bounds apply here, before anything is queued: a constraint over
``--max-grammar-bytes`` or ``--max-grammar-subschemas`` is `Refused` naming its field, and
one that finds ``--max-pending-grammars`` compiles pending (or cannot start within the
compile bound) is `Unavailable` with a retry advice (a 503 with Retry-After). The compiled
spec stays pinned in the cache (the returned ``GrammarPin``) until the request has retired,
so the engine finds it at admission however many other specs the cache saw meanwhile.
"""

from __future__ import annotations

import trio
from actors.core.structured.cache import CompileQueueFull, GrammarPin
from actors.errors import RequestRefused
from actors.params.structured import StructuredSpec

from server.frontend.context import GrammarFacts
from server.frontend.failures import AT_CAPACITY, Refused, Unavailable

__all__ = ["compile_spec"]


async def compile_spec(facts: GrammarFacts, spec: StructuredSpec) -> GrammarPin:
    """Compiles ``spec`` (or finds it compiled) and pins it: release the pin once the
    request has retired. A refusal is `Refused` naming its field; a full queue
    `Unavailable`."""
    from actors.core.structured.cache import peek_shared_cache, shared_cache

    backend = spec.backend or facts.default_backend
    try:  # before anything is built or queued
        spec.check_size(facts.max_grammar_bytes, facts.max_grammar_subschemas)
    except RequestRefused as exc:
        raise Refused(exc.message, exc.param) from None
    eos = facts.eos_token_ids
    cache = peek_shared_cache(backend, facts.model_dir, facts.vocab_size, eos)
    if cache is None:  # the first constrained request builds the backend (~0.5 s)
        try:
            cache = await trio.to_thread.run_sync(
                shared_cache, backend, facts.model_dir, facts.tokenizer, facts.vocab_size, eos)
        except ValueError as exc:  # a backend asked for by the request is not installed
            if spec.backend is None:
                raise
            raise Refused(str(exc), "guided_decoding_backend") from None
    try:
        return await cache.acompile(spec, facts.max_pending_grammars)
    except RequestRefused as exc:
        raise Refused(exc.message, exc.param) from None
    except CompileQueueFull as exc:
        raise Unavailable(AT_CAPACITY, retry_after=exc.retry_after) from None
