"""A request's output constraint, compiled before admission: ``compile_spec``.

The server's bounds apply here, before anything is queued: a constraint over
``--max-grammar-bytes`` or ``--max-grammar-subschemas`` is `Refused` naming its field. The
compile itself is the engine side's (``FrontendContext.prepare_grammar``: the process that
owns the engine core compiles it, once, on its grammar cache's workers, bounded by the
cache's time bound, while this loop only awaits the verdict). A spec the backend refuses is
`Refused` naming its field before the request takes a slot; one that finds
``--max-pending-grammars`` compiles pending (or cannot start within the compile bound) is
`Unavailable` with a retry advice (a 503 with Retry-After). The compiled spec stays pinned
on the engine side until the returned release is called (once the request has retired), so
the engine finds it compiled at admission however many other specs went by. Requests
without a constraint never come here.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from actors.errors import RequestRefused
from actors.messages import PrepareGrammar
from actors.params.structured import StructuredSpec

from server.frontend.context import FrontendContext
from server.frontend.failures import AT_CAPACITY, Refused, Unavailable

__all__ = ["compile_spec"]


async def compile_spec(ctx: FrontendContext, spec: StructuredSpec) -> Callable[[], None]:
    """Has the engine side compile ``spec`` (or find it compiled) and pin it; returns the
    pin's release (call it once the request has retired). A refusal is `Refused` naming its
    field; a full queue `Unavailable`."""
    bounds = ctx.grammar()
    try:  # before anything is built or queued
        spec.check_size(bounds.max_grammar_bytes, bounds.max_grammar_subschemas)
    except RequestRefused as exc:
        raise Refused(exc.message, exc.param) from None
    verdict = await ctx.prepare_grammar(PrepareGrammar(spec, bounds.max_pending_grammars))
    if verdict.outcome == "refused":
        raise Refused(verdict.message, verdict.param)
    if verdict.outcome != "ok":
        raise Unavailable(AT_CAPACITY, retry_after=verdict.retry_after)
    return partial(ctx.release_grammar, verdict.pin)  # idempotent: a pin ends once

