"""Elastic data parallelism: engines join and leave a running DataParallelSystem while
requests run (vLLM's /scale_elastic_ep over our --data-parallel-size).

    join:  core built (a new process) ⇢ its actor system started in the server's nursery ⇢
           `prepare(system)` (the front end's adapters loaded into it) ⇢ in the lists: the
           next request may go there
    leave: the last engine leaves placement (`registry.draining`) ⇢ its requests retire
           (bounded by the drain timeout; past it the engine comes back and the scale fails)
           ⇢ out of the lists ⇢ its actors end ⇢ its process is closed

Nothing is dropped: placement only ever picks an engine in the lists and not draining, a
leaving engine keeps every request it has until it retires, and the front end's admission
grows and shrinks with the count (`per_engine` slots each). A leaving engine's metrics
actor goes with it, so its `engine`-labelled series leave /metrics.

One scale at a time is the caller's to keep (server.api.elastic refuses a second while
one runs), as is running it where a client that leaves cannot cancel it halfway.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
import trio

from actors.core.protocol import EngineCore
from actors.runtime.data_parallel import DataParallelSystem
from actors.runtime.system import ActorSystem

__all__ = ["DrainTimeout", "engine_bound", "resident_bytes", "scale"]

log = logging.getLogger("actors.runtime.elastic")
MEMORY_HEADROOM = 0.8  # share of the available memory new engines may take


class DrainTimeout(Exception):
    """A leaving engine's requests did not retire in time; it is serving again."""


def engine_bound(engines: int, engine_bytes: int) -> int:
    """How many engines this machine holds: one a CPU (each steps on cores of its own), and
    as many more as MEMORY_HEADROOM of the available memory fits at `engine_bytes` an engine
    (an engine's resident set); never fewer than the `engines` running."""
    cpus = len(os.sched_getaffinity(0))
    more = int(available_memory() * MEMORY_HEADROOM) // max(engine_bytes, 1)
    return max(engines, min(cpus, engines + more))


def available_memory() -> int:
    """MemAvailable of /proc/meminfo in bytes (free pages and reclaimable cache)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def resident_bytes(pid: int | None) -> int | None:
    """VmRSS of a live process, None when unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


async def scale(dp: DataParallelSystem, target: int, *, per_engine: int, drain_timeout: float,
                build: Callable[[int], EngineCore],
                prepare: Callable[[ActorSystem], Awaitable[None]],
                joined: Callable[[int, EngineCore], None],
                left: Callable[[int], None]) -> None:
    """Engines added (built by `build(index)` on a worker thread, readied by `prepare`) or
    removed (the last first, each drained) until `target` run. `joined` and `left` tell the
    caller an index's engine arrived or went (its KV-event source). Raises DrainTimeout
    when a leaving engine's requests outlast `drain_timeout` (the engines left so far stay
    gone), and what building or preparing an engine raised (that engine is closed)."""
    while len(dp.systems) < target:
        await _join(dp, per_engine, build, prepare, joined)
    while len(dp.systems) > target:
        await _leave(dp, per_engine, drain_timeout, left)


async def _join(dp: DataParallelSystem, per_engine: int, build: Callable[[int], EngineCore],
                prepare: Callable[[ActorSystem], Awaitable[None]],
                joined: Callable[[int, EngineCore], None]) -> None:
    assert dp.spawn is not None
    i = len(dp.systems)
    log.info("elastic: starting engine %d", i)
    core = await trio.to_thread.run_sync(build, i)
    system: ActorSystem | None = None
    try:
        system = await dp.spawn(core)
        await prepare(system)
    except BaseException:
        with trio.CancelScope(shield=True):
            if system is not None:
                system.close_submissions()
                await system.stopped.wait()
            await trio.to_thread.run_sync(_close, core)
        raise
    dp.cores.append(core)
    dp.systems.append(system)
    dp.registry.parts.append(system.registry)
    dp.metrics.parts.append(system.metrics)
    dp.admission.capacity = per_engine * len(dp.systems)
    joined(i, core)
    log.info("elastic: engine %d serving (%d engines)", i, len(dp.systems))


async def _leave(dp: DataParallelSystem, per_engine: int, drain_timeout: float,
                 left: Callable[[int], None]) -> None:
    i = len(dp.systems) - 1
    system, core = dp.systems[i], dp.cores[i]
    dp.registry.draining.add(i)
    log.info("elastic: draining engine %d (%d requests)", i, len(system.registry))
    with trio.move_on_after(drain_timeout):
        await system.registry.wait_empty()
    if len(system.registry):
        dp.registry.draining.discard(i)
        log.warning("elastic: engine %d still had %d requests after %.0f s; it stays",
                    i, len(system.registry), drain_timeout)
        raise DrainTimeout(f"engine {i} did not drain in {drain_timeout} s")
    # Empty, and out of placement: nothing can reach it any more.
    dp.cores.pop()
    dp.systems.pop()
    dp.registry.parts.pop()
    dp.metrics.parts.pop()
    dp.registry.draining.discard(i)
    dp.forget_pins(i)
    dp.admission.capacity = per_engine * len(dp.systems)
    left(i)
    with trio.CancelScope(shield=True):  # once begun, the engine's end is seen through
        system.close_submissions()
        await system.stopped.wait()
        await trio.to_thread.run_sync(_close, core)
    log.info("elastic: engine %d stopped (%d engines)", i, len(dp.systems))


def _close(core: EngineCore) -> None:
    close = getattr(core, "close", None)
    if close is not None:
        close()
