"""Compiled grammars, bounded and reused: ``GrammarCache``.

Requests with the same constraint (the common case: one schema per client application) share
one compiled grammar; each gets a fresh matcher from it. Compiles run on a small pool of
worker threads, never on the event loop nor the engine's step thread, and a caller waits at
most ``timeout_s`` for one: past that the request is refused naming the field, while the
compile finishes in the background (a thread cannot be stopped) and its outcome is kept, so
a retry of a merely slow spec is served from the cache and a retry of a pathological one is
refused at once. Concurrent requests for one key share one compile, so a pathological spec
ties up at most one worker however often it is sent.

Refusals (invalid specs, compiles that ran past the bound) are cached like grammars: the
same bad spec costs one compile.

``shared_cache`` holds one cache per (backend, tokenizer) for the whole process: the server
compiles a request's spec through it before admission, and an in-process engine core asking
for the same spec then finds it compiled.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from actors.errors import RequestRefused

if TYPE_CHECKING:
    from actors.core.structured.backend import CompiledGrammar, GrammarBackend, Matcher
    from actors.core.structured.spec import StructuredSpec

__all__ = ["DEFAULT_CAPACITY", "DEFAULT_COMPILE_TIMEOUT_S", "GrammarCache", "shared_cache"]

DEFAULT_CAPACITY = 256
DEFAULT_COMPILE_TIMEOUT_S = 10.0


class _Outcome:
    """A finished compile: the grammar or the refusal (message, param) to raise again."""

    __slots__ = ("grammar", "refusal")

    def __init__(self, grammar: CompiledGrammar | None,
                 refusal: tuple[str, str | None] | None) -> None:
        self.grammar = grammar
        self.refusal = refusal

    def matcher(self) -> Matcher:
        if self.refusal is not None:
            raise RequestRefused(*self.refusal)
        assert self.grammar is not None
        return self.grammar.matcher()


class GrammarCache:
    """An LRU of ``capacity`` compiled grammars for one backend.

    ``get(spec)`` blocks the calling thread (the engine's); ``await aget(spec)`` waits on a
    Trio event loop without holding a Trio worker thread. Both return a fresh ``Matcher``
    or raise ``RequestRefused``.
    """

    def __init__(self, backend: GrammarBackend, *, capacity: int = DEFAULT_CAPACITY,
                 timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S, workers: int = 2) -> None:
        if capacity < 1 or timeout_s <= 0 or workers < 1:
            raise ValueError("capacity and workers must be >= 1 and timeout_s > 0")
        self.backend = backend
        self.capacity = capacity
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self._done: OrderedDict[Hashable, _Outcome] = OrderedDict()
        self._pending: dict[Hashable, Future[_Outcome]] = {}
        self._pool = ThreadPoolExecutor(max_workers=workers,
                                        thread_name_prefix="grammar-compile")
        self.hits = self.misses = 0

    def key(self, spec: StructuredSpec) -> Hashable:
        return (self.backend.name, self.backend.tokenizer_key, spec)

    def __len__(self) -> int:
        with self._lock:
            return len(self._done)

    def __contains__(self, spec: StructuredSpec) -> bool:
        with self._lock:
            return self.key(spec) in self._done

    # -- public -----------------------------------------------------------------------------

    def get(self, spec: StructuredSpec) -> Matcher:
        """A matcher for ``spec``, compiling it (bounded by ``timeout_s``) on a miss."""
        outcome, future = self._lookup(spec)
        if outcome is None:
            assert future is not None
            try:
                outcome = future.result(timeout=self.timeout_s)
            except FutureTimeout:
                raise self._too_slow(spec) from None
        return outcome.matcher()

    async def aget(self, spec: StructuredSpec) -> Matcher:
        """``get`` for a Trio task: the wait is a Trio checkpoint, cancellable."""
        import trio

        outcome, future = self._lookup(spec)
        if outcome is None:
            assert future is not None
            done = trio.Event()
            token = trio.lowlevel.current_trio_token()

            def wake(_: Future[_Outcome]) -> None:
                try:
                    token.run_sync_soon(done.set)
                except trio.RunFinishedError:  # the loop ended while the compile ran
                    pass

            future.add_done_callback(wake)
            with trio.move_on_after(self.timeout_s):
                await done.wait()
            if not future.done():
                raise self._too_slow(spec)
            outcome = future.result()
        return outcome.matcher()

    def close(self) -> None:
        """Stops taking compiles; running ones finish in the background."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- internals --------------------------------------------------------------------------

    def _too_slow(self, spec: StructuredSpec) -> RequestRefused:
        return spec.refuse(f"compiling the constraint took longer than {self.timeout_s:g} s; "
                           "simplify it")

    def _lookup(self, spec: StructuredSpec) -> tuple[_Outcome | None, Future[_Outcome] | None]:
        key = self.key(spec)
        with self._lock:
            outcome = self._done.get(key)
            if outcome is not None:
                self._done.move_to_end(key)
                self.hits += 1
                return outcome, None
            future = self._pending.get(key)
            if future is None:
                self.misses += 1
                future = self._pool.submit(self._compile, key, spec)
                self._pending[key] = future
            return None, future

    def _compile(self, key: Hashable, spec: StructuredSpec) -> _Outcome:
        t0 = time.monotonic()
        try:
            outcome = _Outcome(self.backend.compile_grammar(spec), None)
        except RequestRefused as e:
            outcome = _Outcome(None, (e.message, e.param))
        except Exception as e:  # a backend bug must not leave waiters hanging  # noqa: BLE001
            outcome = _Outcome(None, (f"the constraint could not be compiled: {e}",
                                      spec.param))
        elapsed = time.monotonic() - t0
        if outcome.grammar is not None and elapsed > self.timeout_s:
            # slow on its own (not from waiting in the queue): it would be slow again
            refusal = self._too_slow(spec)
            outcome = _Outcome(None, (refusal.message, refusal.param))
        with self._lock:
            self._pending.pop(key, None)
            self._done[key] = outcome
            self._done.move_to_end(key)
            while len(self._done) > self.capacity:
                self._done.popitem(last=False)
        return outcome

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"size": len(self._done), "pending": len(self._pending),
                    "hits": self.hits, "misses": self.misses}


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

    key = (_backend_name(backend), str(model_dir), int(vocab_size), tuple(eos_token_ids))
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
    return _SHARED.get((_backend_name(backend), str(model_dir), int(vocab_size), tuple(eos_token_ids)))


def _backend_name(name: str) -> str:
    return "guidance" if name == "auto" else name  # auto picks guidance: one cache for both
