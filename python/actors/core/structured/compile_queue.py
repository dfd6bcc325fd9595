"""A ``GrammarCache``'s compiles: queued, run on its worker threads, waited for.

- Smallest spec first (``StructuredSpec.size_bytes``): a burst of large schemas does not
  hold up the small ones most requests carry.
- A caller that may be turned away (the HTTP edge) passes ``max_pending``: when that many
  compiles are already queued or running, a new one takes the place of the largest queued
  compile larger than itself (whose waiters get ``CompileQueueFull``), or gets
  ``CompileQueueFull`` itself: a 503 with Retry-After.
- A waiter waits ``timeout_s`` for its compile to start (past that: ``CompileQueueFull``,
  the spec is not at fault), then at most ``timeout_s`` of the compile itself (past that
  the request is refused naming the field; the compile finishes in the background, a
  thread cannot be stopped, and the cache keeps its outcome).
- A queued compile whose waiters have all left (timed out, cancelled, disconnected) is
  dropped: nobody is left to want it. A firm waiter (a ``GrammarHold``) keeps its compile
  from being dropped or displaced for as long as it holds.

The queue shares the cache's lock, so a lookup finds a spec either compiled or pending,
never neither; the methods marked "(under the lock)" expect their caller to hold it.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from actors.errors import RequestRefused

if TYPE_CHECKING:
    from actors.core.structured.spec import StructuredSpec

__all__ = ["CompileJob", "CompileQueue", "CompileQueueFull", "too_slow"]


class CompileQueueFull(Exception):
    """No compile slot for this spec now: the queue is full, or the compile did not start
    within the time bound. Nothing is wrong with the spec; retry after ``retry_after`` s."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


def too_slow(spec: StructuredSpec, timeout_s: float) -> RequestRefused:
    return spec.refuse(f"compiling the constraint took longer than {timeout_s:g} s; "
                       "simplify it")


_QUEUED, _RUNNING, _DONE, _DROPPED = range(4)


class CompileJob:
    """One spec's compile, from queued to done (or dropped), and who waits for it."""

    __slots__ = ("entry", "firm", "future", "key", "size", "spec", "started", "state",
                 "waiters")

    def __init__(self, key: Hashable, spec: StructuredSpec, size: int, seq: int) -> None:
        self.key = key
        self.spec: StructuredSpec | None = spec
        self.size = size
        self.entry = (size, seq, self)  # its place in the heap: smallest spec, then oldest
        self.future: Future[Any] = Future()
        self.state = _QUEUED
        self.started: float | None = None  # time.monotonic() when a worker took it
        self.waiters = 0  # callers waiting for it
        self.firm = 0  # of them, the holds: never dropped nor displaced while they wait


class CompileQueue:
    """The pending compiles of one cache. ``compile(spec)`` runs on up to ``workers``
    threads and never raises; ``store(key, outcome)`` is then called under the lock, before
    the job's waiters are woken with the outcome."""

    def __init__(self, lock: threading.Condition, compile: Callable[[StructuredSpec], Any],
                 store: Callable[[Hashable, Any], None], workers: int,
                 timeout_s: float) -> None:
        self._lock = lock  # idle workers wait on it
        self._compile = compile
        self._store = store
        self._workers = workers
        self.timeout_s = timeout_s
        self._pending: dict[Hashable, CompileJob] = {}  # queued or running
        self._heap: list[tuple[int, int, CompileJob]] = []  # the queued jobs' entries
        self._seq = itertools.count()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.misses = 0  # compiles queued
        self.turned_away = 0  # CompileQueueFull for a full queue (newcomers and displaced)
        self.dropped = 0  # queued compiles whose waiters all left

    def stats(self) -> dict[str, int]:
        """(Under the lock.)"""
        return {"pending": len(self._pending), "queued": len(self._heap),
                "misses": self.misses, "turned_away": self.turned_away,
                "dropped": self.dropped}

    def join(self, key: Hashable, spec: StructuredSpec, max_pending: int | None = None,
             firm: bool = False) -> CompileJob:
        """(Under the lock.) The pending job for ``key``, queued now if there is none, with
        one more waiter: every join needs its ``leave``."""
        job = self._pending.get(key)
        if job is None:
            if self._closed:
                raise CompileQueueFull("the grammar cache is closed", 5)
            size = spec.size_bytes()
            if max_pending is not None and len(self._pending) >= max_pending:
                self._make_room(size)
            self.misses += 1
            job = CompileJob(key, spec, size, next(self._seq))
            self._pending[key] = job
            heapq.heappush(self._heap, job.entry)
            if len(self._threads) < self._workers:
                t = threading.Thread(target=self._work, name="grammar-compile", daemon=True)
                self._threads.append(t)
                t.start()
            self._lock.notify()
        job.waiters += 1
        job.firm += firm
        return job

    def leave(self, job: CompileJob, firm: bool = False) -> None:
        """A waiter is gone; the last one to leave a compile still queued drops it."""
        with self._lock:
            job.waiters -= 1
            job.firm -= firm
            if job.waiters > 0 or job.state != _QUEUED:
                return
            self._unqueue(job)
            self.dropped += 1
        job.future.cancel()

    def wait(self, job: CompileJob, spec: StructuredSpec) -> Any:
        """Blocks the calling thread for the job's outcome (within the bounds), then leaves."""
        arrived = time.monotonic()
        try:
            while True:
                left = self._deadline(job, arrived) - time.monotonic()
                if left <= 0:
                    raise self._expired(job, spec)
                try:
                    return job.future.result(timeout=left)
                except FutureTimeout:
                    continue  # it may have started meanwhile: the deadline moves
        finally:
            self.leave(job)

    async def await_job(self, job: CompileJob, spec: StructuredSpec) -> Any:
        """``wait`` for a Trio task: the wait is a Trio checkpoint, cancellable."""
        import trio

        from actors.core.future_event import done_event

        arrived = time.monotonic()
        try:
            done = done_event(job.future)
            while not job.future.done():
                left = self._deadline(job, arrived) - time.monotonic()
                if left <= 0:
                    raise self._expired(job, spec)
                with trio.move_on_after(left):
                    await done.wait()
            return job.future.result()
        finally:
            self.leave(job)

    def close(self) -> None:
        """Stops taking compiles; queued ones are dropped, running ones finish unobserved."""
        with self._lock:
            self._closed = True
            queued = [entry[2] for entry in self._heap]
            self._heap.clear()
            for job in queued:
                self._pending.pop(job.key, None)
                job.state = _DROPPED
            self._lock.notify_all()
        for job in queued:
            job.future.set_exception(CompileQueueFull("the grammar cache is closed", 5))

    # -- internals --------------------------------------------------------------------------

    def _make_room(self, size: int) -> None:
        """(Under the lock.) Drops the largest queued compile larger than ``size`` that no
        hold keeps, its waiters told to retry; or refuses the newcomer."""
        victim = max((e[2] for e in self._heap if e[2].firm == 0 and e[0] > size),
                     key=lambda j: j.size, default=None)
        self.turned_away += 1
        if victim is None:
            raise CompileQueueFull(f"{len(self._pending)} grammar compiles are pending, the "
                                   "most this server queues; retry shortly")
        self._unqueue(victim)
        # no waiter callback takes this lock: completing it here is safe
        victim.future.set_exception(CompileQueueFull(
            "the grammar compile queue is full; a smaller constraint took this one's place"))

    def _unqueue(self, job: CompileJob) -> None:
        """(Under the lock.) Takes a queued job out of the queue for good."""
        self._heap.remove(job.entry)
        heapq.heapify(self._heap)
        del self._pending[job.key]
        job.state = _DROPPED
        job.spec = None

    def _deadline(self, job: CompileJob, arrived: float) -> float:
        """When a waiter that came at ``arrived`` gives up: ``timeout_s`` for the compile to
        start, then ``timeout_s`` from its start."""
        started = job.started
        return (arrived if started is None else started) + self.timeout_s

    def _expired(self, job: CompileJob, spec: StructuredSpec) -> Exception:
        if job.started is None:
            return CompileQueueFull(f"no grammar compile could start within "
                                    f"{self.timeout_s:g} s; retry shortly")
        return too_slow(spec, self.timeout_s)

    def _work(self) -> None:
        """A worker: the smallest queued spec first, until the queue is closed."""
        while True:
            with self._lock:
                while not self._heap and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                job = heapq.heappop(self._heap)[2]
                job.state = _RUNNING
                job.started = time.monotonic()
                spec = job.spec
            assert spec is not None
            outcome = self._compile(spec)
            with self._lock:
                job.state = _DONE
                job.spec = None
                del self._pending[job.key]
                self._store(job.key, outcome)
            job.future.set_result(outcome)
