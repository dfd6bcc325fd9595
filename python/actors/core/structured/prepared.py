"""Grammars compiled before admission, on the engine side: ``PreparedGrammars``.

The front end asks the engine core to compile a request's constraint before it admits the
request (``EngineCore.prepare_grammar``), so that a spec the backend refuses is a 400 naming
its field before the request takes a slot, and the compile runs once, in the process whose
engine uses the grammar. The compile goes through the process's ``GrammarCache`` on the
cache's worker threads, bounded by the cache's time bound; the caller only awaits (a Trio
task: the engine actor's loop in process, the grammar thread of a child-process core).
Neither the step thread nor an event loop compiles.

A compiled spec stays pinned in the cache under the verdict's ``pin`` until the front end
releases it (once the request has retired), so the engine's ``add`` finds it compiled
however many other specs the cache saw meanwhile (``held.HeldRequests`` keeps it from then
on). Building the backend itself (~0.5 s, once per process) runs in a worker thread.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from actors.core.structured.cache import CompileQueueFull, peek_shared_cache
from actors.errors import RequestRefused
from actors.messages import GrammarVerdict, PrepareGrammar

if TYPE_CHECKING:
    from actors.core.structured.cache import GrammarCache, GrammarPin

__all__ = ["PreparedGrammars"]


class PreparedGrammars:
    """The pins of the grammars compiled for requests not yet retired.

    ``build(backend)``: the process's cache for the engine's model (``shared_cache``, slow
    on first use); ``model_dir``, ``vocab_size`` and ``eos_token_ids`` name that cache."""

    def __init__(self, default_backend: str, build: Callable[[str], GrammarCache],
                 model_dir: str, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self._default_backend = default_backend
        self._build = build
        self._cache_args = (model_dir, vocab_size, eos_token_ids)
        self._lock = threading.Lock()  # prepare and release may come from any thread
        self._pins: dict[int, GrammarPin] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pins)

    async def prepare(self, request: PrepareGrammar) -> GrammarVerdict:
        """Compiles (or finds compiled) and pins ``request.spec``. Raises ValueError when
        the default backend cannot be built (one the request named is a refusal)."""
        spec = request.spec
        backend = spec.backend or self._default_backend
        cache = peek_shared_cache(backend, *self._cache_args)
        if cache is None:  # the first constrained request builds the backend
            try:
                cache = await trio.to_thread.run_sync(self._build, backend)
            except ValueError as exc:  # a backend asked for by the request is not installed
                if spec.backend is None:
                    raise
                return GrammarVerdict("refused", message=str(exc),
                                      param="guided_decoding_backend")
        try:
            pin = await cache.acompile(spec, request.max_pending)
        except RequestRefused as exc:
            return GrammarVerdict("refused", message=exc.message, param=exc.param)
        except CompileQueueFull as exc:
            return GrammarVerdict("busy", message=exc.message, retry_after=exc.retry_after)
        with self._lock:
            ticket = next(self._ids)
            self._pins[ticket] = pin
        return GrammarVerdict("ok", pin=ticket)

    def release(self, ticket: int) -> None:
        """Ends a pin (unknown or released tickets are ignored); never blocks."""
        with self._lock:
            pin = self._pins.pop(ticket, None)
        if pin is not None:
            pin.release()
