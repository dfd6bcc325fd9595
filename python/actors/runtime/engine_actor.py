"""The engine actor: owns the model and runs its steps in a worker thread.

Loading (weights, KV cache) happens in `run` before `started()`, so once the supervisor's
`nursery.start` returns, the engine can serve. Steps run in `trio.to_thread.run_sync`
under a limiter of one: the engine is not re-entrant, and its native code releases the
GIL so the Trio thread keeps serving HTTP meanwhile. Only the scheduler actor calls
`step`, and it mutates the engine (add/abort) only between steps, never during one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

log = logging.getLogger("server.engine")


class EngineFailed(RuntimeError):
    """The engine raised during a step: every in-flight request is lost."""


class EngineActor:
    def __init__(self, make_engine: Callable[[], Any]) -> None:
        self._make_engine = make_engine
        self._limiter = trio.CapacityLimiter(1)
        self.engine: Any = None

    async def run(self, *, task_status: trio.TaskStatus[EngineActor] = trio.TASK_STATUS_IGNORED):
        log.info("loading the engine")
        self.engine = await trio.to_thread.run_sync(self._make_engine, limiter=self._limiter)
        log.info("engine ready")
        task_status.started(self)
        await trio.sleep_forever()

    async def step(self) -> list[Any]:
        """One engine step. Not cancellable mid-step: a step leaves the engine consistent."""
        try:
            return await trio.to_thread.run_sync(self.engine.step, limiter=self._limiter)
        except Exception as exc:
            raise EngineFailed(f"engine step failed: {type(exc).__name__}") from exc
