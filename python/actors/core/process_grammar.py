"""A child-process core's grammar channel: compiles asked for before admission.

``EngineCore.prepare_grammar`` may run while a step runs, and a compile takes up to the
cache's time bound, so it cannot share the command pipe of ``actors.core.process`` (one
question, one answer, in order). It has a pipe of its own:

    parent (GrammarClient)                        child (serve_grammars, its own thread)
      ("prepare", id, PrepareGrammar) -------->  a Trio task: LLMEngine.prepare_grammar
      ("release", 0, pin)              -------->  LLMEngine.release_grammar
      (id, "ok", GrammarVerdict) | (id, "err", exception)  <--------

The child answers each prepare when its compile ends, in any order, from a Trio loop in a
thread of its own: the compile runs on the child's grammar cache's workers, its step loop
never waits for it, and its ``add`` then finds the grammar compiled and pinned. In the
parent a reader thread completes each caller's future; the caller (a Trio task) only
awaits. A caller that leaves before the answer has any pin it would have got released.
"""

from __future__ import annotations

import itertools
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import trio

from actors.core.future_event import done_event
from actors.messages import GrammarVerdict, PrepareGrammar

__all__ = ["GrammarClient", "portable", "serve_grammars"]


class GrammarClient:
    """The parent's end of the grammar pipe. ``died()``: the exception a caller gets once
    the child is gone."""

    def __init__(self, conn: Any, died: Callable[[], BaseException]) -> None:
        self._conn = conn
        self._died = died
        self._lock = threading.Lock()  # guards sends, _pending and _gone
        self._pending: dict[int, Future[GrammarVerdict]] = {}
        self._ids = itertools.count(1)
        self._gone = False
        self._reader = threading.Thread(target=self._read, name="grammar-replies",
                                        daemon=True)
        self._reader.start()

    async def prepare(self, request: PrepareGrammar) -> GrammarVerdict:
        future: Future[GrammarVerdict] = Future()
        with self._lock:
            if self._gone:
                raise self._died()
            ident = next(self._ids)
            self._pending[ident] = future
            try:
                self._conn.send(("prepare", ident, request))
            except (OSError, EOFError):
                del self._pending[ident]
                raise self._died() from None
        done = done_event(future)
        try:
            await done.wait()
        except BaseException:
            future.add_done_callback(self._unwanted)  # its pin, if any, is nobody's
            raise
        return future.result()

    def release(self, pin: int) -> None:
        with self._lock:
            if self._gone:
                return  # the child's pins went with it
            try:
                self._conn.send(("release", 0, pin))
            except (OSError, EOFError):
                pass

    def close(self) -> None:
        """Ends the channel: the child's grammar thread sees EOF; waiting callers fail."""
        with self._lock:
            self._gone = True
        self._conn.close()

    def _unwanted(self, future: Future[GrammarVerdict]) -> None:
        if not future.cancelled() and future.exception() is None:
            verdict = future.result()
            if verdict.outcome == "ok":
                self.release(verdict.pin)

    def _read(self) -> None:
        while True:
            try:
                ident, status, value = self._conn.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                future = self._pending.pop(ident, None)
            if future is None:
                continue
            if status == "ok":
                future.set_result(value)
            else:
                future.set_exception(value)
        with self._lock:
            self._gone = True
            pending, self._pending = list(self._pending.values()), {}
        for future in pending:
            future.set_exception(self._died())


def serve_grammars(conn: Any, engine: Any) -> None:
    """The child's grammar thread: answers prepares and releases until the parent's end
    closes."""
    trio.run(_serve, conn, engine)


async def _serve(conn: Any, engine: Any) -> None:
    async def answer(ident: int, request: PrepareGrammar) -> None:
        try:
            reply = (ident, "ok", await engine.prepare_grammar(request))
        except Exception as exc:  # noqa: BLE001 - raised again in the parent
            reply = (ident, "err", portable(exc))
        try:
            conn.send(reply)
        except (OSError, EOFError):
            pass  # the parent is gone

    async with trio.open_nursery() as nursery:
        while True:
            try:
                op, ident, arg = await trio.to_thread.run_sync(conn.recv)
            except (EOFError, OSError):
                break
            if op == "prepare":
                nursery.start_soon(answer, ident, arg)
            else:
                engine.release_grammar(arg)
        nursery.cancel_scope.cancel()


def portable(exc: BaseException) -> BaseException:
    """The exception itself if it survives pickling, else a RuntimeError naming it; with
    the child's traceback attached as a note either way."""
    import pickle

    note = "in the engine core process:\n" + "".join(traceback.format_exception(exc))
    try:
        out = pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any pickling failure
        out = RuntimeError(f"{type(exc).__name__}: {exc}")
    out.add_note(note)
    return out
