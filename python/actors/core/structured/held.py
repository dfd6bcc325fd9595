"""Constrained requests at the engine's door: ``HeldRequests``.

``LLMEngine.add`` never compiles a grammar nor waits for one: it runs on the event loop's
thread, or answers a data-parallel parent that waits on it. A request whose spec is compiled
is queued at once; one whose spec is still compiling (or whose grammar backend is still
being built, ~0.5 s, in a thread of its own) is held here, outside the scheduler, and a
later step queues it once its compile has ended, or ends it with "error" when the compile
refused it. A refusal the cache already knows is raised by ``add`` itself.

The compiled grammars of the engine's live requests are kept here, and each choice's
matcher is built from them (``mask``), never from the cache: an eviction from the cache
cannot make a step compile.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from actors.errors import RequestRefused
from actors.messages import Admit, RequestOutput

if TYPE_CHECKING:
    from actors.core.scheduler.policy import Scheduler
    from actors.core.structured.backend import CompiledGrammar
    from actors.core.structured.cache import GrammarCache, GrammarHold
    from actors.params.structured import StructuredSpec

__all__ = ["GRAMMARS_KEPT", "HELD_WAIT_S", "HeldRequests"]

log = logging.getLogger("actors.core.structured.held")

# A step with nothing to run but held requests waits this long for one of their compiles
# (in the step's thread, never the event loop's) before it returns.
HELD_WAIT_S = 0.05
# Compiled grammars kept beyond those of the live requests before the engine looks for ones
# no live request uses.
GRAMMARS_KEPT = 64


@dataclass(slots=True)
class _Held:
    """A request whose grammar is not compiled yet. ``hold`` is None while the grammar
    backend itself is being built."""

    admit: Admit
    hold: GrammarHold | None = None
    cancelled: set[int] = field(default_factory=set)  # choices aborted meanwhile

    def outputs(self, reason: str) -> list[RequestOutput]:
        """The end of every choice not aborted before."""
        admit = self.admit
        return [RequestOutput(admit.request_id, i, (), None, True, reason, None,
                              len(admit.prompt_token_ids), 0, 0)
                for i in range(admit.kind.params.n) if i not in self.cancelled]

    def release(self) -> None:
        if self.hold is not None:
            self.hold.release()


class HeldRequests:
    """The engine's constrained requests until they are queued, and their grammars.

    ``build(backend)``: the process's grammar cache for the engine's model (``shared_cache``:
    slow on first use, so called in a thread of its own); ``model_dir``, ``vocab_size`` and
    ``eos_token_ids`` name that cache, and size the token masks."""

    def __init__(self, scheduler: Scheduler, default_backend: str,
                 build: Callable[[str], GrammarCache], model_dir: str, vocab_size: int,
                 eos_token_ids: tuple[int, ...]) -> None:
        self._scheduler = scheduler
        self._default_backend = default_backend
        self._build = build
        self._cache_args = (model_dir, vocab_size, eos_token_ids)
        self._held: dict[str, _Held] = {}
        self._builds: dict[str, Future[None]] = {}  # grammar backends being built
        self._grammars: dict[StructuredSpec, tuple[CompiledGrammar, int]] = {}
        self._prune_at = GRAMMARS_KEPT

    def __len__(self) -> int:
        return len(self._held)

    def admit(self, admit: Admit) -> bool:
        """Whether ``admit`` may be queued now (its grammar, if any, is kept here); False:
        it is held. Raises ValueError for what the scheduler refuses (its checks run now, so
        a held request is refused at once), a request id already in flight (held or
        queued), RequestRefused for a spec
        the cache already refused or a backend that cannot be built."""
        rid = admit.request_id
        if rid in self._held:
            raise ValueError(f"request id {rid!r} is already in flight")
        self._scheduler.check_admit(admit)  # what the scheduler would refuse, refused now
        spec = admit.kind.params.structured
        if spec is None or spec in self._grammars:
            return True
        held = _Held(admit)
        if self._ready(held):
            self._keep(spec, held.hold)
            return True
        self._held[rid] = held
        return False

    def admit_ready(self) -> list[RequestOutput]:
        """Queues the held requests whose compile has ended (between steps, in the step's
        thread); returns the ends of those refused. Waits up to HELD_WAIT_S for a compile
        when the scheduler has nothing to run."""
        if not self._scheduler.has_unfinished():
            waiting = [h.hold.future for h in self._held.values()
                       if h.hold is not None and h.hold.future is not None]
            waiting += [b for b in self._builds.values() if not b.done()]
            if waiting:
                wait_futures(waiting, timeout=HELD_WAIT_S, return_when=FIRST_COMPLETED)
        ended: list[RequestOutput] = []
        for rid, held in list(self._held.items()):
            try:
                if not self._ready(held):
                    continue
                del self._held[rid]
                self._keep(held.admit.kind.params.structured, held.hold)
                self._scheduler.add_request(held.admit)
            except Exception as exc:  # noqa: BLE001 - a refusal, or a check the edge made
                self._held.pop(rid, None)
                held.release()
                log.warning("request %s refused once its grammar compiled: %s", rid, exc)
                ended += held.outputs("error")
                continue
            for index in sorted(held.cancelled):
                self._scheduler.abort(rid, index)
        return ended

    def abort(self, request_id: str, index: int | None = None) -> list[RequestOutput] | None:
        """Ends a held request, or its choice ``index``: the ends of the choices it ends;
        None when the request is not held."""
        held = self._held.get(request_id)
        if held is None:
            return None
        n = held.admit.kind.params.n
        if index is None:
            out = held.outputs("abort")
            held.cancelled.update(range(n))
        elif 0 <= index < n and index not in held.cancelled:
            out = [o for o in held.outputs("abort") if o.index == index]
            held.cancelled.add(index)
        else:
            out = []
        if len(held.cancelled) == n:
            del self._held[request_id]
            held.release()
        return out

    def mask(self, spec: StructuredSpec, outputs: tuple[int, ...]) -> Any:
        """A choice's token mask (``ModelRunner.structured_masks``: asked when the choice
        first runs, in a step), from the grammar kept at its request's admission: never a
        compile here."""
        from actors.core.structured.mask import mask_for

        def matcher() -> tuple[Any, int]:
            kept = self._grammars.get(spec)
            if kept is None:
                raise RuntimeError("the constraint's grammar is not compiled in this engine")
            return kept[0].matcher(), kept[1]

        _, vocab_size, eos_token_ids = self._cache_args
        return mask_for(matcher, vocab_size, eos_token_ids, outputs)

    # -- internals --------------------------------------------------------------------------

    def _ready(self, held: _Held) -> bool:
        """Whether the held request's compile has ended; takes its hold once the backend is
        built. Raises RequestRefused when the backend cannot be built."""
        if held.hold is None:
            spec = held.admit.kind.params.structured
            cache = self._cache_for(spec)
            if cache is None:
                return False
            held.hold = cache.hold(spec)
        return held.hold.ready()

    def _cache_for(self, spec: StructuredSpec) -> GrammarCache | None:
        """The spec's backend's cache, or None while it is being built."""
        from actors.core.structured.cache import peek_shared_cache

        name = spec.backend or self._default_backend
        cache = peek_shared_cache(name, *self._cache_args)
        if cache is not None:
            return cache
        build = self._builds.get(name)
        if build is None:
            build = self._builds[name] = Future()
            threading.Thread(target=self._build_backend, args=(name, build), daemon=True,
                             name="grammar-backend").start()
        if build.done() and build.exception() is not None:
            raise RequestRefused(f"structured outputs are unavailable: {build.exception()}",
                                 "guided_decoding_backend" if spec.backend else spec.param)
        return None

    def _build_backend(self, name: str, done: Future[None]) -> None:
        try:
            self._build(name)
        except Exception as exc:  # noqa: BLE001 - its requests are refused with it
            log.warning("the %s grammar backend could not be built: %s", name, exc)
            done.set_exception(exc)
        else:
            done.set_result(None)

    def _keep(self, spec: StructuredSpec, hold: GrammarHold) -> None:
        """Keeps the compiled grammar of a ready hold, and releases it (raises the spec's
        refusal). Past ``_prune_at`` grammars, drops those no live request uses."""
        try:
            grammar = hold.grammar()
        finally:
            hold.release()
        if len(self._grammars) >= self._prune_at:
            live = {s.params.structured for seqs in self._scheduler._requests.values()
                    for s in seqs}
            live.update(h.admit.kind.params.structured for h in self._held.values())
            self._grammars = {k: v for k, v in self._grammars.items() if k in live}
            self._prune_at = max(GRAMMARS_KEPT, 2 * len(self._grammars))
        self._grammars[spec] = (grammar, hold.vocab_size)
