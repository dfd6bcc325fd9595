"""Compiled grammars, bounded and reused: ``GrammarCache``.

Requests with the same constraint (the common case: one schema per client application) share
one compiled grammar; each gets a fresh matcher from it. Compiles run on a small pool of
worker threads, never on the event loop nor the engine's step thread. Concurrent requests
for one key share one compile, so a pathological spec ties up at most one worker however
often it is sent. How compiles are queued, bounded and dropped, and how long a waiter
waits, is ``compile_queue``'s: a compile that ran past its bound still finishes in the
background and its outcome is kept, so a retry of a merely slow spec is served from the
cache and a retry of a pathological one is refused at once.

Refusals (invalid specs, compiles that ran past the bound) are cached like grammars: the
same bad spec costs one compile.

Two holds keep a compiled grammar from the LRU's eviction: a ``GrammarPin`` (the HTTP edge
pins its request's spec until the request has retired, so that the engine finds it compiled
at admission however many other specs went by), and a ``GrammarHold``, the engine's claim
on a compile that it never waits for (``LLMEngine.add`` checks it between steps).

``shared_cache`` holds one cache per (backend, tokenizer) for the whole process: the engine
core compiles a request's spec through it when the front end asks before admission
(``actors.core.structured.prepared``), and its ``add`` then finds the spec compiled.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from actors.core.structured.compile_queue import (
    CompileJob,
    CompileQueue,
    CompileQueueFull,
    too_slow,
)
from actors.errors import RequestRefused

if TYPE_CHECKING:
    from actors.core.structured.backend import CompiledGrammar, GrammarBackend, Matcher
    from actors.core.structured.spec import StructuredSpec

__all__ = ["DEFAULT_CAPACITY", "DEFAULT_COMPILE_TIMEOUT_S", "DEFAULT_MAX_BYTES",
           "DEFAULT_MAX_PENDING", "DEFAULT_MAX_SUBSCHEMAS", "CompileQueueFull", "GrammarCache",
           "GrammarHold", "GrammarPin", "peek_shared_cache", "shared_cache",
           "shared_compiles"]

DEFAULT_CAPACITY = 256
DEFAULT_COMPILE_TIMEOUT_S = 10.0
# The HTTP edge's bounds (the server's --max-grammar-bytes, --max-grammar-subschemas and
# --max-pending-grammars): 10 000 subschemas compile in about a second and a half here.
DEFAULT_MAX_BYTES = 1 << 20
DEFAULT_MAX_SUBSCHEMAS = 10_000
DEFAULT_MAX_PENDING = 32


class _Outcome:
    """A finished compile: the grammar or the refusal (message, param) to raise again."""

    __slots__ = ("grammar", "refusal")

    def __init__(self, grammar: CompiledGrammar | None,
                 refusal: tuple[str, str | None] | None) -> None:
        self.grammar = grammar
        self.refusal = refusal

    def compiled(self) -> CompiledGrammar:
        if self.refusal is not None:
            raise RequestRefused(*self.refusal)
        assert self.grammar is not None
        return self.grammar


class GrammarPin:
    """Keeps one compiled spec from eviction until ``release()`` (idempotent)."""

    __slots__ = ("_cache", "_key")

    def __init__(self, cache: GrammarCache, key: Hashable) -> None:
        self._cache: GrammarCache | None = cache
        self._key = key

    def release(self) -> None:
        cache, self._cache = self._cache, None
        if cache is not None:
            cache._unpin(self._key)


class GrammarHold:
    """A claim on one spec's compile for a caller that must never wait (the engine's
    admission): ``ready()`` polls, ``grammar()`` then gives the compiled grammar (or raises
    the refusal). The compile is neither dropped nor displaced while the hold lasts;
    ``release()`` (idempotent) ends it. ``vocab_size``: the backend's vocabulary."""

    __slots__ = ("_job", "_outcome", "_queue", "vocab_size")

    def __init__(self, cache: GrammarCache, job: CompileJob | None,
                 outcome: _Outcome | None) -> None:
        self._queue: CompileQueue | None = None if job is None else cache._queue
        self._job = job  # None: a hit, ``outcome`` is its
        self._outcome = outcome
        self.vocab_size: int = cache.backend.vocab_size

    @property
    def future(self) -> Future[_Outcome] | None:
        """What to wait on while not ready (None for a hit)."""
        return None if self._job is None else self._job.future

    def ready(self) -> bool:
        return self._job is None or self._job.future.done()

    def grammar(self) -> CompiledGrammar:
        """The compiled grammar; raises the refusal (or why the compile never ran)."""
        outcome = self._outcome if self._job is None else self._job.future.result(timeout=0)
        return outcome.compiled()

    def release(self) -> None:
        queue, self._queue = self._queue, None
        if queue is not None and self._job is not None:
            queue.leave(self._job, firm=True)


class GrammarCache:
    """An LRU of ``capacity`` compiled grammars for one backend, and its compile queue.

    ``get(spec)`` blocks the calling thread; ``await aget(spec)`` waits on a Trio event loop
    without holding a Trio worker thread. Both return a fresh ``Matcher`` or raise
    ``RequestRefused`` (or ``CompileQueueFull``). ``await acompile(spec)`` compiles and
    pins; ``hold(spec)`` never waits. ``max_pending``: the bound of a caller that may be
    turned away (the HTTP edge; None: never turned away).
    """

    def __init__(self, backend: GrammarBackend, *, capacity: int = DEFAULT_CAPACITY,
                 timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S, workers: int = 2) -> None:
        if capacity < 1 or timeout_s <= 0 or workers < 1:
            raise ValueError("capacity and workers must be >= 1 and timeout_s > 0")
        self.backend = backend
        self.capacity = capacity
        self.timeout_s = float(timeout_s)
        self._lock = threading.Condition()  # guards everything below and the queue
        self._done: OrderedDict[Hashable, _Outcome] = OrderedDict()
        self._pins: dict[Hashable, int] = {}
        self._queue = CompileQueue(self._lock, self._compile, self._store, workers,
                                   self.timeout_s)
        self.hits = 0

    def key(self, spec: StructuredSpec) -> Hashable:
        return (self.backend.name, self.backend.tokenizer_key, spec)

    def __len__(self) -> int:
        with self._lock:
            return len(self._done)

    def __contains__(self, spec: StructuredSpec) -> bool:
        with self._lock:
            return self.key(spec) in self._done

    # -- public -----------------------------------------------------------------------------

    def get(self, spec: StructuredSpec, max_pending: int | None = None) -> Matcher:
        """A matcher for ``spec``, compiling it (bounded by ``timeout_s``) on a miss."""
        outcome, job = self._lookup(spec, max_pending)
        if job is not None:
            outcome = self._queue.wait(job, spec)
        return outcome.compiled().matcher()

    async def aget(self, spec: StructuredSpec, max_pending: int | None = None) -> Matcher:
        """``get`` for a Trio task: the wait is a Trio checkpoint, cancellable."""
        return (await self._outcome_async(spec, max_pending)).compiled().matcher()

    async def acompile(self, spec: StructuredSpec,
                       max_pending: int | None = None) -> GrammarPin:
        """Compiles ``spec`` (or finds it compiled), waiting as ``aget`` does, and pins it:
        it stays compiled until the pin is released. Raises ``RequestRefused`` naming the
        field, or ``CompileQueueFull``."""
        outcome = await self._outcome_async(spec, max_pending)
        outcome.compiled()  # raises a refusal
        return self._pin(self.key(spec), outcome)

    def hold(self, spec: StructuredSpec) -> GrammarHold:
        """A claim on ``spec``'s compile, queued if need be (never turned away); never
        waits."""
        key = self.key(spec)
        with self._lock:
            outcome = self._hit(key)
            job = None if outcome is not None else self._queue.join(key, spec, firm=True)
        return GrammarHold(self, job, outcome)

    def close(self) -> None:
        """Stops taking compiles; queued ones are dropped, running ones finish unobserved."""
        self._queue.close()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"size": len(self._done), "pinned": len(self._pins), "hits": self.hits,
                    **self._queue.stats()}

    # -- lookups ----------------------------------------------------------------------------

    def _lookup(self, spec: StructuredSpec, max_pending: int | None
                ) -> tuple[_Outcome | None, CompileJob | None]:
        """The cached outcome, or the job to wait for (joined: the wait leaves it)."""
        key = self.key(spec)
        with self._lock:
            outcome = self._hit(key)
            if outcome is not None:
                return outcome, None
            return None, self._queue.join(key, spec, max_pending)

    def _hit(self, key: Hashable) -> _Outcome | None:
        """(Under the lock.)"""
        outcome = self._done.get(key)
        if outcome is not None:
            self._done.move_to_end(key)
            self.hits += 1
        return outcome

    async def _outcome_async(self, spec: StructuredSpec,
                             max_pending: int | None) -> _Outcome:
        outcome, job = self._lookup(spec, max_pending)
        if job is not None:
            outcome = await self._queue.await_job(job, spec)
        assert outcome is not None
        return outcome

    # -- the LRU and its pins ---------------------------------------------------------------

    def _store(self, key: Hashable, outcome: _Outcome) -> None:
        """(Under the lock.) Keeps an outcome, evicting the oldest unpinned beyond capacity."""
        self._done[key] = outcome
        self._done.move_to_end(key)
        self._evict()

    def _evict(self) -> None:
        """(Under the lock.) The oldest unpinned entries beyond capacity go."""
        while len(self._done) > self.capacity:
            oldest = next((k for k in self._done if k not in self._pins), None)
            if oldest is None:
                break  # every entry is pinned: over capacity until pins are released
            del self._done[oldest]

    def _pin(self, key: Hashable, outcome: _Outcome) -> GrammarPin:
        with self._lock:
            self._pins[key] = self._pins.get(key, 0) + 1
            if key not in self._done:  # evicted between its compile and now: it is back
                self._store(key, outcome)
        return GrammarPin(self, key)

    def _unpin(self, key: Hashable) -> None:
        with self._lock:
            left = self._pins.pop(key, 0) - 1
            if left > 0:
                self._pins[key] = left
            else:
                self._evict()

    # -- compiling (on the queue's workers) ---------------------------------------------------

    def _compile(self, spec: StructuredSpec) -> _Outcome:
        t0 = time.monotonic()
        try:
            outcome = _Outcome(self.backend.compile_grammar(spec), None)
        except RequestRefused as e:
            outcome = _Outcome(None, (e.message, e.param))
        except Exception as e:  # a backend bug must not leave waiters hanging  # noqa: BLE001
            outcome = _Outcome(None, (f"the constraint could not be compiled: {e}",
                                      spec.param))
        if outcome.grammar is not None and time.monotonic() - t0 > self.timeout_s:
            # slow on its own (not from waiting in the queue): it would be slow again
            refusal = too_slow(spec, self.timeout_s)
            outcome = _Outcome(None, (refusal.message, refusal.param))
        return outcome


_SHARED: dict[Hashable, GrammarCache] = {}
_SHARED_LOCK = threading.Lock()


def shared_cache(backend: str, model_dir: str, tokenizer: Any, vocab_size: int,
                 eos_token_ids: tuple[int, ...]) -> GrammarCache:
    """The process's cache for the ``backend`` over the tokenizer of ``model_dir`` with
    the model's logits width and end-of-sequence tokens; built on first use (about half a
    second: the backend's token trie), so call it off the event loop and the step thread.
    ``tokenizer`` is only read by that first build: the server and the engine each load
    their own copy of the same tokenizer, and both get the one cache."""
    from actors.core.structured.backend import make_backend

    key = _shared_key(backend, model_dir, vocab_size, eos_token_ids)
    cache = _SHARED.get(key)
    if cache is not None:
        return cache
    with _SHARED_LOCK:
        cache = _SHARED.get(key)
        if cache is None:
            cache = GrammarCache(make_backend(backend, tokenizer, vocab_size,
                                              tuple(eos_token_ids) or None))
            _SHARED[key] = cache
    return cache


def peek_shared_cache(backend: str, model_dir: str, vocab_size: int,
                      eos_token_ids: tuple[int, ...]) -> GrammarCache | None:
    """The cache ``shared_cache`` built for these arguments, or None (never builds)."""
    return _SHARED.get(_shared_key(backend, model_dir, vocab_size, eos_token_ids))


def shared_compiles(model_dir: str, vocab_size: int, eos_token_ids: tuple[int, ...]) -> int:
    """The compiles queued so far by this process's caches for the model (every backend)."""
    model = (str(model_dir), int(vocab_size), tuple(eos_token_ids))
    caches = [c for k, c in list(_SHARED.items()) if k[1:] == model]
    return sum(c.stats()["misses"] for c in caches)


def _shared_key(backend: str, model_dir: str, vocab_size: int,
                eos_token_ids: tuple[int, ...]) -> Hashable:
    name = "guidance" if backend == "auto" else backend  # auto picks guidance: one cache
    return (name, str(model_dir), int(vocab_size), tuple(eos_token_ids))
