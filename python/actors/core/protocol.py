"""EngineCore: the one interface the front end drives the engine core through.

In process it is ``actors.core.engine.LLMEngine``; ``actors.core.process.ProcessEngineCore``
runs the same core in a child process behind the same messages. Every method is called
from one thread at a time, and ``add``/``abort``/``control`` only between steps; except
``prepare_grammar`` and ``release_grammar``, which may run at any time, steps included.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from actors.messages import Abort, Admit, Control, ControlResult, EngineInfo, EngineStats
from actors.messages import GrammarVerdict, PrepareGrammar, TokenBatch

__all__ = ["EngineCore"]


@runtime_checkable
class EngineCore(Protocol):
    @property
    def info(self) -> EngineInfo: ...

    def add(self, admit: Admit) -> None:
        """Queues a prompt with params.n choices. Raises actors.errors.RequestRefused for a
        request that can never run (the front end's checks should have caught it)."""

    def abort(self, abort: Abort) -> None:
        """Ends a request or one choice now; its outputs (finish_reason "abort") are not
        reported. Unknown ids are ignored."""

    async def prepare_grammar(self, request: PrepareGrammar) -> GrammarVerdict:
        """Compiles a request's constraint before it is admitted, in the core's process,
        once (never on the step thread), bounded by the grammar cache's time bound; awaited
        on a Trio loop. An "ok" pins the grammar until ``release_grammar(verdict.pin)``, so
        that ``add`` finds it compiled. Raises ValueError when the engine's default
        grammar backend cannot be built."""

    def release_grammar(self, pin: int) -> None:
        """Ends a pin of ``prepare_grammar``; never blocks. Unknown pins are ignored."""

    def step(self) -> TokenBatch:
        """Runs one step; an idle core returns an empty batch at once."""

    def has_unfinished(self) -> bool: ...

    def stats(self) -> EngineStats: ...

    def control(self, command: Control) -> ControlResult: ...
