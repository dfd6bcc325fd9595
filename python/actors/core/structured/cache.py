"""Compiled grammars, bounded and reused: ``GrammarCache``.

Requests with the same constraint (the common case: one schema per client application) share
one compiled grammar; each gets a fresh matcher from it. Compiles run on a small pool of
worker threads, never on the event loop nor the engine's step thread. Concurrent requests
for one key share one compile, so a pathological spec ties up at most one worker however
often it is sent.

The queue of compiles, and what a waiter gets:

- Smallest spec first (``StructuredSpec.size_bytes``): a burst of large schemas does not
  hold up the small ones most requests carry.
- A caller that may be turned away (the HTTP edge) passes ``CompileLimits``. A spec over
  ``max_bytes`` or ``max_subschemas`` is refused naming its field before anything is
  queued. When ``max_pending`` compiles are already queued or running, a new one takes the
  place of the largest queued compile larger than itself (whose waiters get
  ``CompileQueueFull``), or gets ``CompileQueueFull`` itself: a 503 with Retry-After.
- A waiter waits ``timeout_s`` for its compile to start (past that: ``CompileQueueFull``,
  the spec is not at fault), then at most ``timeout_s`` of the compile itself (past that
  the request is refused naming the field; the compile finishes in the background, a
  thread cannot be stopped, and its outcome is kept, so a retry of a merely slow spec is
  served from the cache and a retry of a pathological one is refused at once).
- A queued compile whose waiters have all left (timed out, cancelled, disconnected) is
  dropped: nobody is left to want it.

Refusals (invalid specs, compiles that ran past the bound) are cached like grammars: the
same bad spec costs one compile.

Two holds keep a compiled grammar from the LRU's eviction: a ``GrammarPin`` (the HTTP edge
pins its request's spec until the request has retired, so that the engine finds it compiled
at admission however many other specs went by), and a ``GrammarHold``, the engine's claim
on a compile that it never waits for (``LLMEngine.add`` checks it between steps).

``shared_cache`` holds one cache per (backend, tokenizer) for the whole process: the server
compiles a request's spec through it before admission, and an in-process engine core asking
for the same spec then finds it compiled.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from actors.errors import RequestRefused

if TYPE_CHECKING:
    from actors.core.structured.backend import CompiledGrammar, GrammarBackend, Matcher
    from actors.core.structured.spec import StructuredSpec

__all__ = ["DEFAULT_CAPACITY", "DEFAULT_COMPILE_TIMEOUT_S", "DEFAULT_MAX_BYTES",
           "DEFAULT_MAX_PENDING", "DEFAULT_MAX_SUBSCHEMAS", "CompileLimits", "CompileQueueFull",
           "GrammarCache", "GrammarHold", "GrammarPin", "peek_shared_cache", "shared_cache"]

DEFAULT_CAPACITY = 256
DEFAULT_COMPILE_TIMEOUT_S = 10.0
# The HTTP edge's bounds (the server's --max-grammar-bytes, --max-grammar-subschemas and
# --max-pending-grammars): 10 000 subschemas compile in about a second and a half here.
DEFAULT_MAX_BYTES = 1 << 20
DEFAULT_MAX_SUBSCHEMAS = 10_000
DEFAULT_MAX_PENDING = 32


class CompileQueueFull(Exception):
    """No compile slot for this spec now: the queue is full, or the compile did not start
    within the time bound. Nothing is wrong with the spec; retry after ``retry_after`` s."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class CompileLimits:
    """What a caller that may be turned away asks before a spec is queued (None: no bound)."""

    max_bytes: int | None = DEFAULT_MAX_BYTES
    max_subschemas: int | None = DEFAULT_MAX_SUBSCHEMAS
    max_pending: int | None = DEFAULT_MAX_PENDING


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

    def matcher(self) -> Matcher:
        return self.compiled().matcher()


_QUEUED, _RUNNING, _DONE, _DROPPED = range(4)


class _Job:
    """One spec's compile, from queued to done (or dropped), and who waits for it."""

    __slots__ = ("entry", "future", "key", "size", "spec", "started", "state", "waiters",
                 "firm")

    def __init__(self, key: Hashable, spec: StructuredSpec, size: int, seq: int) -> None:
        self.key = key
        self.spec: StructuredSpec | None = spec
        self.size = size
        self.entry = (size, seq, self)  # its place in the heap: smallest spec, then oldest
        self.future: Future[_Outcome] = Future()
        self.state = _QUEUED
        self.started: float | None = None  # time.monotonic() when a worker took it
        self.waiters = 0  # callers waiting for it
        self.firm = 0  # of them, the holds: never dropped nor displaced while they wait


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
    ``release()`` (idempotent) ends it."""

    __slots__ = ("_cache", "_job", "_outcome", "vocab_size")

    def __init__(self, cache: GrammarCache, job: _Job | None, outcome: _Outcome | None) -> None:
        self._cache: GrammarCache | None = cache if job is not None else None
        self._job = job
        self._outcome = outcome
        self.vocab_size: int = cache.backend.vocab_size

    @property
    def future(self) -> Future[_Outcome] | None:
        """What to wait on while not ready (None once ready)."""
        return None if self._job is None else self._job.future

    def ready(self) -> bool:
        return self._outcome is not None or self._job is None or self._job.future.done()

    def grammar(self) -> CompiledGrammar:
        """The compiled grammar; raises the refusal (or why the compile never ran)."""
        outcome = self._outcome
        if outcome is None:
            assert self._job is not None
            outcome = self._job.future.result(timeout=0)
        return outcome.compiled()

    def release(self) -> None:
        cache, self._cache = self._cache, None
        if cache is not None and self._job is not None:
            cache._leave(self._job, firm=True)


class GrammarCache:
    """An LRU of ``capacity`` compiled grammars for one backend, and its compile queue.

    ``get(spec)`` blocks the calling thread; ``await aget(spec)`` waits on a Trio event loop
    without holding a Trio worker thread. Both return a fresh ``Matcher`` or raise
    ``RequestRefused`` (or ``CompileQueueFull``). ``await acompile(spec, limits)`` compiles
    and pins; ``hold(spec)`` never waits.
    """

    def __init__(self, backend: GrammarBackend, *, capacity: int = DEFAULT_CAPACITY,
                 timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S, workers: int = 2) -> None:
        if capacity < 1 or timeout_s <= 0 or workers < 1:
            raise ValueError("capacity and workers must be >= 1 and timeout_s > 0")
        self.backend = backend
        self.capacity = capacity
        self.timeout_s = float(timeout_s)
        self._workers = workers
        self._lock = threading.Condition()  # guards everything below; idle workers wait on it
        self._done: OrderedDict[Hashable, _Outcome] = OrderedDict()
        self._pins: dict[Hashable, int] = {}
        self._pending: dict[Hashable, _Job] = {}  # queued or running
        self._queue: list[tuple[int, int, _Job]] = []  # heap of the queued jobs' entries
        self._seq = itertools.count()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.hits = self.misses = 0
        self.turned_away = 0  # CompileQueueFull for a full queue (newcomers and displaced)
        self.dropped = 0  # queued compiles whose waiters all left

    def key(self, spec: StructuredSpec) -> Hashable:
        return (self.backend.name, self.backend.tokenizer_key, spec)

    def __len__(self) -> int:
        with self._lock:
            return len(self._done)

    def __contains__(self, spec: StructuredSpec) -> bool:
        with self._lock:
            return self.key(spec) in self._done

    # -- public -----------------------------------------------------------------------------

    def get(self, spec: StructuredSpec, limits: CompileLimits | None = None) -> Matcher:
        """A matcher for ``spec``, compiling it (bounded by ``timeout_s``) on a miss."""
        outcome, job = self._lookup(spec, limits)
        if outcome is not None:
            return outcome.matcher()
        assert job is not None
        arrived = time.monotonic()
        try:
            while True:
                left = self._deadline(job, arrived) - time.monotonic()
                if left <= 0:
                    raise self._expired(job, spec)
                try:
                    outcome = job.future.result(timeout=left)
                    break
                except FutureTimeout:
                    continue  # it may have started meanwhile: the deadline moves
        finally:
            self._leave(job)
        return outcome.matcher()

    async def aget(self, spec: StructuredSpec, limits: CompileLimits | None = None) -> Matcher:
        """``get`` for a Trio task: the wait is a Trio checkpoint, cancellable."""
        return (await self._outcome_async(spec, limits)).matcher()

    async def acompile(self, spec: StructuredSpec,
                       limits: CompileLimits | None = None) -> GrammarPin:
        """Compiles ``spec`` (or finds it compiled), waiting as ``aget`` does, and pins it:
        it stays compiled until the pin is released. Raises ``RequestRefused`` naming the
        field, or ``CompileQueueFull``."""
        outcome = await self._outcome_async(spec, limits)
        outcome.compiled()  # raises a refusal
        return self._pin(self.key(spec), outcome)

    def hold(self, spec: StructuredSpec) -> GrammarHold:
        """A claim on ``spec``'s compile, queued if need be (no limits); never waits."""
        key, size = self.key(spec), spec.size_bytes()
        with self._lock:
            outcome = self._hit(key)
            if outcome is not None:
                return GrammarHold(self, None, outcome)
            job = self._join(key, spec, size, None)
            job.firm += 1
        return GrammarHold(self, job, None)

    def close(self) -> None:
        """Stops taking compiles; queued ones are dropped, running ones finish unobserved."""
        with self._lock:
            self._closed = True
            queued = [entry[2] for entry in self._queue]
            self._queue.clear()
            for job in queued:
                self._pending.pop(job.key, None)
                job.state = _DROPPED
            self._lock.notify_all()
        for job in queued:
            job.future.set_exception(CompileQueueFull("the grammar cache is closed", 5))

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"size": len(self._done), "pending": len(self._pending),
                    "queued": len(self._queue), "pinned": len(self._pins),
                    "hits": self.hits, "misses": self.misses,
                    "turned_away": self.turned_away, "dropped": self.dropped}

    # -- the queue --------------------------------------------------------------------------

    def _lookup(self, spec: StructuredSpec, limits: CompileLimits | None
                ) -> tuple[_Outcome | None, _Job | None]:
        """The cached outcome, or the job to wait for (its waiter count taken)."""
        size = spec.size_bytes()
        if limits is not None:
            spec.check_size(limits.max_bytes, limits.max_subschemas)
        key = self.key(spec)
        with self._lock:
            outcome = self._hit(key)
            if outcome is not None:
                return outcome, None
            return None, self._join(key, spec, size,
                                    None if limits is None else limits.max_pending)

    def _hit(self, key: Hashable) -> _Outcome | None:
        outcome = self._done.get(key)
        if outcome is not None:
            self._done.move_to_end(key)
            self.hits += 1
        return outcome

    def _join(self, key: Hashable, spec: StructuredSpec, size: int,
              max_pending: int | None) -> _Job:
        """(Under the lock.) The pending job for ``key``, queued now if there is none."""
        job = self._pending.get(key)
        if job is None:
            if self._closed:
                raise CompileQueueFull("the grammar cache is closed", 5)
            if max_pending is not None and len(self._pending) >= max_pending:
                self._make_room(size)
            self.misses += 1
            job = _Job(key, spec, size, next(self._seq))
            self._pending[key] = job
            heapq.heappush(self._queue, job.entry)
            if len(self._threads) < self._workers:
                t = threading.Thread(target=self._work, name="grammar-compile", daemon=True)
                self._threads.append(t)
                t.start()
            self._lock.notify()
        job.waiters += 1
        return job

    def _make_room(self, size: int) -> None:
        """(Under the lock.) Drops the largest queued compile larger than ``size`` that no
        hold keeps, its waiters told to retry; or refuses the newcomer."""
        victim = max((e[2] for e in self._queue if e[2].firm == 0 and e[0] > size),
                     key=lambda j: j.size, default=None)
        self.turned_away += 1
        if victim is None:
            raise CompileQueueFull(f"{len(self._pending)} grammar compiles are pending, the "
                                   "most this server queues; retry shortly")
        self._unqueue(victim)
        # no waiter callback takes this lock: completing it here is safe
        victim.future.set_exception(CompileQueueFull(
            "the grammar compile queue is full; a smaller constraint took this one's place"))

    def _unqueue(self, job: _Job) -> None:
        """(Under the lock.) Takes a queued job out of the queue for good."""
        self._queue.remove(job.entry)
        heapq.heapify(self._queue)
        del self._pending[job.key]
        job.state = _DROPPED
        job.spec = None

    def _leave(self, job: _Job, firm: bool = False) -> None:
        """A waiter is gone; the last one to leave a compile still queued drops it."""
        with self._lock:
            job.waiters -= 1
            if firm:
                job.firm -= 1
            if job.waiters > 0 or job.state != _QUEUED:
                return
            self._unqueue(job)
            self.dropped += 1
        job.future.cancel()

    def _deadline(self, job: _Job, arrived: float) -> float:
        """When a waiter that came at ``arrived`` gives up: ``timeout_s`` for the compile to
        start, then ``timeout_s`` from its start."""
        started = job.started
        return arrived + self.timeout_s if started is None else started + self.timeout_s

    def _expired(self, job: _Job, spec: StructuredSpec) -> Exception:
        if job.started is None:
            return CompileQueueFull(f"no grammar compile could start within "
                                    f"{self.timeout_s:g} s; retry shortly")
        return self._too_slow(spec)

    async def _outcome_async(self, spec: StructuredSpec,
                             limits: CompileLimits | None) -> _Outcome:
        import trio

        outcome, job = self._lookup(spec, limits)
        if outcome is not None:
            return outcome
        assert job is not None
        arrived = time.monotonic()
        try:
            done = trio.Event()
            token = trio.lowlevel.current_trio_token()

            def wake(_: Future[_Outcome]) -> None:
                try:
                    token.run_sync_soon(done.set)
                except trio.RunFinishedError:  # the loop ended while the compile ran
                    pass

            job.future.add_done_callback(wake)
            while not job.future.done():
                left = self._deadline(job, arrived) - time.monotonic()
                if left <= 0:
                    raise self._expired(job, spec)
                with trio.move_on_after(left):
                    await done.wait()
            return job.future.result()
        finally:
            self._leave(job)

    def _work(self) -> None:
        """A worker: the smallest queued spec first, until the cache is closed."""
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                job = heapq.heappop(self._queue)[2]
                job.state = _RUNNING
                job.started = time.monotonic()
                spec = job.spec
            assert spec is not None
            outcome = self._compile(spec)
            with self._lock:
                job.state = _DONE
                job.spec = None
                if self._pending.get(job.key) is job:
                    del self._pending[job.key]
                self._store(job.key, outcome)
            job.future.set_result(outcome)

    # -- the LRU and its pins ---------------------------------------------------------------

    def _store(self, key: Hashable, outcome: _Outcome) -> None:
        """(Under the lock.) Keeps an outcome, evicting the oldest unpinned beyond capacity."""
        self._done[key] = outcome
        self._done.move_to_end(key)
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
            left = self._pins.get(key, 0) - 1
            if left > 0:
                self._pins[key] = left
                return
            self._pins.pop(key, None)
            while len(self._done) > self.capacity:
                oldest = next((k for k in self._done if k not in self._pins), None)
                if oldest is None:
                    break
                del self._done[oldest]

    # -- compiling --------------------------------------------------------------------------

    def _too_slow(self, spec: StructuredSpec) -> RequestRefused:
        return spec.refuse(f"compiling the constraint took longer than {self.timeout_s:g} s; "
                           "simplify it")

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
            refusal = self._too_slow(spec)
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
