"""vLLM's elastic data-parallel routes over our --data-parallel-size: POST /scale_elastic_ep
adds or removes engine cores while the server serves, POST /is_scaling_elastic_ep says
whether a scale runs. The mechanics are actors.runtime.elastic's; this module checks the
request, bounds the count, and gives the new engines what the front end holds (the LoRA
adapters loaded so far, the KV-event source of each rank).

Bodies, answers and errors are vLLM 0.34's (serve/elastic_ep): ``{"new_data_parallel_size":
N, "drain_timeout": S}`` (S seconds, default 120) answers ``{"message": "Scaled to N data
parallel engines"}``; a missing or non-positive-integer field, a body that is not JSON and
a size above the bound are 400s with vLLM's messages; a leaving engine that does not drain
in time is a 408 (vLLM's message; that engine serves on); any other failure a 500 "Scale
failed". A scale while one runs gets vLLM's middleware answer, 503 with
``{"error": "The model is currently scaling. Please try again later."}``.

Unlike vLLM, nothing else is refused while a scale runs: the other routes keep serving on
the engines there are, an added engine takes requests once it has loaded, and a removed one
drains (takes no new request, finishes its own) before it exits. Booleans are no integers
here. The bound is --elastic-ep-max-dp-size, else what the machine holds (one engine a CPU,
as many as 80% of the memory available at start fits at engine 0's resident size); without
--enable-elastic-ep the size is fixed (a scale to the running size is answered, as vLLM
does, and any other is a 400).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import trio
from quart import Quart, Response, request

from actors.core.protocol import EngineCore
from actors.messages import Control
from actors.runtime.data_parallel import DataParallelSystem
from actors.runtime.elastic import DrainTimeout, engine_bound, resident_bytes, scale
from actors.runtime.system import ActorSystem
from server.api.http_io import json_response
from server.api.lora import names_of
from server.errors import APIError, bad_request
from server.state import ServerState

log = logging.getLogger("server.elastic")

DEFAULT_DRAIN_TIMEOUT = 120  # seconds, vLLM's
SCALING_BODY = {"error": "The model is currently scaling. Please try again later."}
FALLBACK_ENGINE_BYTES = 1 << 30  # when engine 0's resident size cannot be read


@dataclass
class Elastic:
    """What a scale needs, fixed at start: the bound, each engine's admission share, and
    how to build engine i (a process core with rank i's config); `busy` while a scale runs
    (vLLM's "is scaling": one at a time)."""

    max_engines: int
    per_engine: int
    build: Callable[[int], EngineCore]
    busy: bool = False


def elastic_settings(max_dp_size: int | None, cores: list[EngineCore], per_engine: int,
                     build: Callable[[int], EngineCore]) -> Elastic:
    """The bound: --elastic-ep-max-dp-size when given, else what the machine holds."""
    if max_dp_size is None:
        rss = resident_bytes(getattr(cores[0], "pid", None)) or FALLBACK_ENGINE_BYTES
        max_dp_size = engine_bound(len(cores), rss)
        log.info("elastic data parallel: up to %d engine cores (engine 0 holds %.2f GiB)",
                 max_dp_size, rss / (1 << 30))
    return Elastic(max_dp_size, per_engine, build)


def register(app: Quart, srv: ServerState) -> None:
    @app.post("/scale_elastic_ep")
    async def scale_elastic_ep() -> Response:
        body = await _body()
        target = body.get("new_data_parallel_size")
        drain_timeout = body.get("drain_timeout", DEFAULT_DRAIN_TIMEOUT)
        if target is None:
            raise bad_request("new_data_parallel_size is required")
        if not _positive_int(target):
            raise bad_request("new_data_parallel_size must be a positive integer")
        if not _positive_int(drain_timeout):
            raise bad_request("drain_timeout must be a positive integer")
        el: Elastic | None = srv.elastic
        if el is not None and el.busy:
            return json_response(SCALING_BODY, 503)
        if srv.health.draining:
            raise APIError(503, "The server is draining.")
        current = _engines(srv)
        if target != current:
            if el is None:
                raise bad_request("Elastic data parallel is not enabled: start the server "
                                  "with --enable-elastic-ep.")
            if target > el.max_engines:
                raise bad_request(f"Cannot scale to data_parallel_size {target}; "
                                  f"--elastic-ep-max-dp-size is {el.max_engines}.")
            await _run(srv, el, target, drain_timeout)
        return json_response({"message": f"Scaled to {target} data parallel engines"})

    @app.post("/is_scaling_elastic_ep")
    async def is_scaling_elastic_ep() -> Response:
        el: Elastic | None = srv.elastic
        busy = el is not None and el.busy
        return json_response({"is_scaling_elastic_ep": busy,
                              "phase": "committing" if busy else "idle", "epoch": None,
                              "error": None, "requested_data_parallel_size": None})


def _engines(srv: ServerState) -> int:
    actors = srv.actors
    return len(actors.systems) if isinstance(actors, DataParallelSystem) else 1


async def _run(srv: ServerState, el: Elastic, target: int, drain_timeout: int) -> None:
    """The scale, in the server's nursery (a client that leaves does not stop it halfway);
    the route waits for its end."""
    dp = srv.actors
    assert isinstance(dp, DataParallelSystem) and srv.reaper is not None
    el.busy = True
    outcome: list[BaseException | None] = []
    done = trio.Event()

    async def work() -> None:
        try:
            # One LoRA load or unload at a time with the scale: an engine that joins gets
            # every adapter loaded so far, and a load after it reaches it too.
            async with names_of(srv).lock:
                await scale(dp, target, per_engine=el.per_engine, drain_timeout=drain_timeout,
                            build=el.build, prepare=_prepare_for(srv),
                            joined=_joined_for(srv),
                            left=lambda rank: srv.kv_event_sources.pop(rank, None))
            outcome.append(None)
        except Exception as exc:  # told to the caller; the server serves on
            outcome.append(exc)
        finally:
            el.busy = False
            done.set()

    srv.reaper.start_soon(work)
    await done.wait()
    error = outcome[0] if outcome else None
    if isinstance(error, DrainTimeout):
        raise APIError(408, "Scale failed due to request drain timeout after "
                       f"{drain_timeout} seconds")
    if error is not None:
        log.error("Scale failed: %s", error)
        raise APIError(500, "Scale failed")
    log.info("scaled to %d data parallel engines", target)


def _prepare_for(srv: ServerState) -> Callable[[ActorSystem], Any]:
    async def prepare(system: ActorSystem) -> None:
        for name, (lora_id, path) in names_of(srv).adapters.items():
            result = await system.control(Control("load_lora_adapter",
                                                  (("lora_id", lora_id), ("path", path))))
            if not result.ok:
                raise RuntimeError(f"LoRA adapter {name!r} on the new engine: {result.error}")
    return prepare


def _joined_for(srv: ServerState) -> Callable[[int, EngineCore], None]:
    def joined(rank: int, core: EngineCore) -> None:
        source = core.info.kv_event_source
        if source:
            srv.kv_event_sources[rank] = dict(source)
    return joined


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


async def _body() -> dict[str, Any]:
    ctype = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise bad_request("the request body must be JSON (Content-Type: application/json)")
    try:
        body = orjson.loads(await request.get_data(cache=False))
    except orjson.JSONDecodeError:
        raise bad_request("Invalid JSON format") from None
    if not isinstance(body, dict):
        raise bad_request("Invalid JSON format")
    return body
