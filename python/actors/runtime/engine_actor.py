"""The engine actor: owns the model and runs its steps in a worker thread.

Loading (weights, KV cache) happens in `run` before `started()`, so once the supervisor's
`nursery.start` returns, the engine can serve. Steps run in `trio.to_thread.run_sync`
under a limiter of one: the engine is not re-entrant, and its native code releases the
GIL so the Trio thread keeps serving HTTP meanwhile. Only the scheduler actor calls
`step`, and it mutates the engine (add/abort) only between steps, never during one.

Fault injection (for the server's failure tests, off unless set): the environment variable
LLMSERVE_FAULT_AFTER_STEPS=N, read once when the actor is built, makes every engine step
after the N-th raise inside the worker thread, exactly where a real step failure (a kernel
error, an out-of-memory) would surface. It changes nothing else. The bad_row point of
LLMSERVE_FAULT_INJECT (actors.runtime.faults) spoils one sequence's row before a step.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import trio

from actors.messages import TokenBatch
from actors.runtime import faults
from actors.runtime.faults import InjectedFault

log = logging.getLogger("server.engine")

FAULT_ENV = "LLMSERVE_FAULT_AFTER_STEPS"


class EngineFailed(RuntimeError):
    """The engine raised during a step: every in-flight request is lost."""


def _fault_after(environ: dict[str, str] | os._Environ[str] = os.environ) -> int | None:
    raw = environ.get(FAULT_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{FAULT_ENV} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{FAULT_ENV} must be >= 0, got {value}")
    return value


class EngineActor:
    def __init__(self, make_engine: Callable[[], Any]) -> None:
        self._make_engine = make_engine
        self._limiter = trio.CapacityLimiter(1)
        self.engine: Any = None
        self._fault_after = _fault_after()
        self._steps = 0
        if self._fault_after is not None:
            log.warning("%s=%d: engine steps after that many will fail", FAULT_ENV,
                        self._fault_after)

    async def run(self, *, task_status: trio.TaskStatus[EngineActor] = trio.TASK_STATUS_IGNORED):
        log.info("loading the engine")
        self.engine = await trio.to_thread.run_sync(self._make_engine, limiter=self._limiter)
        log.info("engine ready")
        task_status.started(self)
        await trio.sleep_forever()

    def _step(self) -> TokenBatch:
        """Runs in the worker thread."""
        self._steps += 1
        if self._fault_after is not None and self._steps > self._fault_after:
            raise InjectedFault(f"injected fault at engine step {self._steps}")
        faults.maybe_spoil_row(self.engine)
        return self.engine.step()

    async def step(self) -> TokenBatch:
        """One engine step. Not cancellable mid-step: a step leaves the engine consistent."""
        try:
            return await trio.to_thread.run_sync(self._step, limiter=self._limiter)
        except Exception as exc:
            log.error("engine step failed", exc_info=exc)
            raise EngineFailed(f"engine step failed: {type(exc).__name__}") from exc
