"""ProcessEngineCore: the engine core in a child process, behind the EngineCore messages.

The child (a ``multiprocessing`` spawn child, so no torch or thread state is inherited)
builds an ``LLMEngine`` from the config and answers one request at a time over a Pipe:

    parent                                   child
      (op, message) ------------------------->  LLMEngine.add / abort / step / stats /
      ("ok", value) | ("err", exception) <---   control / has_unfinished

Everything crossing is a frozen dataclass of ``actors.messages`` (or a bool, or None),
pickled; nothing on either side shares memory. A refusal (``RequestRefused`` and its
subclasses) is raised again in the parent with its type and ``param``; any other exception
in the child comes back as itself when it pickles (else a RuntimeError naming it), with
the child's traceback as a note. A child that dies or stops answering makes every later
call raise ``EngineCoreDied``. ``close()`` (or leaving the ``with`` block) stops the child
and waits for it.

The in-process engine and this one give the same tokens for the same calls: a draw
depends only on (seed, position) and its row, never on the process it runs in.

``prepare_grammar`` / ``release_grammar`` have a pipe of their own (the child answers
them while it steps: ``actors.core.process_grammar``), so a request's constraint compiles
once, in the child, before the request is admitted. The parent's ``add`` waits for the
child's answer on its event loop's thread, so the child's ``LLMEngine.add`` never compiles
either: a spec not prepared (nor pinned) there is queued on the cache's workers and its
request held until a later step (``actors.core.structured.held``).
"""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any

from actors.core.process_grammar import GrammarClient, portable, serve_grammars
from actors.messages import Abort, Admit, Control, ControlResult, EngineInfo, EngineStats
from actors.messages import GrammarVerdict, PrepareGrammar, TokenBatch

__all__ = ["EngineCoreDied", "ProcessEngineCore"]

# The child loads the model before it answers; a cold GGUF conversion takes longest.
START_TIMEOUT_S = 600.0


class EngineCoreDied(RuntimeError):
    """The child process ended (or never started) while the core was in use."""


class ProcessEngineCore:
    """EngineCore over a child process running LLMEngine(config)."""

    def __init__(self, config: Any, *, start_timeout: float = START_TIMEOUT_S) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        grammar_conn, child_grammar_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child_conn, child_grammar_conn, config),
                                 name="llmserve-engine-core", daemon=True)
        self._proc.start()
        child_conn.close()  # the child's ends; EOF here once the child exits
        child_grammar_conn.close()
        self._closed = False
        self._grammars = GrammarClient(grammar_conn, self._died)
        try:
            if not self._conn.poll(start_timeout):
                raise EngineCoreDied(f"the engine core did not start in {start_timeout} s")
            self._info: EngineInfo = self._answer()
        except BaseException:
            self._kill()
            raise

    # ------------------------------------------------------------------ EngineCore

    @property
    def info(self) -> EngineInfo:
        return self._info

    def add(self, admit: Admit) -> None:
        self._call("add", admit)

    def abort(self, abort: Abort) -> None:
        self._call("abort", abort)

    async def prepare_grammar(self, request: PrepareGrammar) -> GrammarVerdict:
        return await self._grammars.prepare(request)

    def release_grammar(self, pin: int) -> None:
        self._grammars.release(pin)

    def step(self) -> TokenBatch:
        return self._call("step")

    def has_unfinished(self) -> bool:
        return self._call("has_unfinished")

    def stats(self) -> EngineStats:
        return self._call("stats")

    def control(self, command: Control) -> ControlResult:
        return self._call("control", command)

    # ------------------------------------------------------------------ lifetime

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def alive(self) -> bool:
        """Whether the child still runs: a watcher's poll, which sends it nothing."""
        return self._proc.is_alive()

    def close(self, timeout: float = 30.0) -> None:
        """Stops the child and reaps it (killed if it does not stop within timeout)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._conn.send(("close", None))
        except (OSError, EOFError):
            pass  # already gone
        self._proc.join(timeout)
        self._kill()

    def __enter__(self) -> ProcessEngineCore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _kill(self) -> None:
        self._closed = True
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join()
        self._conn.close()
        self._grammars.close()

    def _died(self) -> EngineCoreDied:
        return EngineCoreDied(f"the engine core exited ({self._proc.exitcode})")

    def _call(self, op: str, arg: Any = None) -> Any:
        if self._closed:
            raise EngineCoreDied("the engine core is closed")
        try:
            self._conn.send((op, arg))
        except (OSError, EOFError) as exc:
            self._kill()
            raise EngineCoreDied(f"the engine core exited ({self._proc.exitcode})") from exc
        return self._answer()

    def _answer(self) -> Any:
        try:
            status, value = self._conn.recv()
        except (OSError, EOFError) as exc:
            self._kill()
            raise EngineCoreDied(f"the engine core exited ({self._proc.exitcode})") from exc
        if status == "err":
            raise value
        return value


_OPS = {
    "add": lambda e, m: e.add(m),
    "abort": lambda e, m: e.abort(m),
    "step": lambda e, _: e.step(),
    "has_unfinished": lambda e, _: e.has_unfinished(),
    "stats": lambda e, _: e.stats(),
    "control": lambda e, m: e.control(m),
}


def _serve(conn: Any, grammar_conn: Any, config: Any) -> None:
    """The child's loop: build the engine, then answer until told to close or orphaned;
    the grammar pipe is answered by a thread of its own."""
    try:
        from actors.core.engine import LLMEngine

        engine = LLMEngine(config)
        conn.send(("ok", engine.info))
    except BaseException as exc:  # the parent raises it; the child has nothing to run
        conn.send(("err", portable(exc)))
        return
    threading.Thread(target=serve_grammars, args=(grammar_conn, engine), daemon=True,
                     name="grammar-requests").start()
    while True:
        try:
            op, arg = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if op == "close":
            return
        try:
            reply = ("ok", _OPS[op](engine, arg))
        except Exception as exc:
            reply = ("err", portable(exc))
        conn.send(reply)
