"""A request's output constraint, compiled before admission: ``compile_spec``.

The spec (``SamplingParams.structured``) is compiled through the process's shared
``GrammarCache`` on the cache's worker threads, bounded in time, while the event loop only
waits; a spec the backend refuses is a 400 naming its field before the request takes a
slot, and an in-process engine core then finds the grammar compiled (a cache hit). Requests
without a constraint never come here.
"""

from __future__ import annotations

from typing import Any

import trio

from actors.errors import RequestRefused
from actors.params.structured import StructuredSpec
from server.errors import bad_request

__all__ = ["compile_spec"]


async def compile_spec(srv: Any, spec: StructuredSpec) -> None:
    """Compiles ``spec`` (or finds it compiled); a refusal is a 400 naming its field."""
    from actors.core.structured.cache import peek_shared_cache, shared_cache

    info = srv.actors.info
    backend = spec.backend or srv.config.engine.structured_outputs_backend
    eos = tuple(info.eos_token_ids)
    cache = peek_shared_cache(backend, info.model_dir, info.vocab_size, eos)
    if cache is None:  # the first constrained request builds the backend (~0.5 s)
        try:
            cache = await trio.to_thread.run_sync(
                shared_cache, backend, info.model_dir, srv.tokenizer, info.vocab_size, eos)
        except ValueError as exc:  # a backend asked for by the request is not installed
            if spec.backend is None:
                raise
            raise bad_request(str(exc), "guided_decoding_backend") from None
    try:
        await cache.aget(spec)
    except RequestRefused as exc:
        raise bad_request(exc.message, exc.param) from None
