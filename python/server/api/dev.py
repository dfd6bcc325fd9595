"""The operator routes of vLLM's dev mode (``VLLM_SERVER_DEV_MODE=1``, or our
``--enable-dev-endpoints``): pause and resume, abort, sleep and wake, releasing the KV
cache, the prefix, multimodal and encoder caches, server info and a fenced
``collective_rpc``. The weight transfer for RL loops is server.api.weights'.

Nothing here touches the engine: each route sends one typed ``Control`` to the engine
actor, which applies it between steps (actors.runtime.engine_actor, actors.core.operator)
and answers with a ``ControlResult``. Without the flag none of these routes exists (404);
with ``--api-key`` every one of them needs the key (vLLM leaves them open). Paths, query
parameters and bodies are vLLM's (0.33's rl/online and serve/dev routers; 0.34's cache and
sleep routes: /reset_mm_cache and /reset_encoder_cache answer 200 with no body,
/release_kv_cache_memory ``{"status": "kv_cache_released"}``, or a 409 unless a /pause has
completed, where vLLM's engine raises and its server answers 500). Errors come in our
envelope, with ``param`` naming the query field as vLLM does (``query.mode``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
from typing import Any

import orjson
from quart import Quart, Response, request

from actors.core.operator import resident_bytes
from actors.messages import Control, ControlResult
from server import __version__
from server.api.http_io import json_response, read_json
from server.errors import APIError, bad_request
from server.frontend.generation import request_names
from server.state import ServerState

log = logging.getLogger("server.dev")

PAUSE_MODES = ("abort", "wait", "keep")
# What /collective_rpc may call: commands that read state or drop caches, nothing that
# runs code a client names (vLLM forwards any worker method name).
RPC_METHODS = ("reset_prefix_cache", "weight_info", "is_paused", "is_sleeping")
# The environment /server_info shows: only these names, settings this server reads (or its
# threading and device libraries do), none of them a credential. Anything else (tokens,
# passwords, a cloud's keys, VLLM_*_SECRET) stays out, whatever its name.
SERVER_INFO_ENV = (
    "VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_MAX_AUDIO_CLIP_FILESIZE_MB",
    "VLLM_MAX_AUDIO_DECODE_DURATION_S", "VLLM_MAX_AUDIO_DECODE_BYTES",
    "VLLM_MAX_AUDIO_PREPROCESS_WORKERS", "LLMSERVE_STATE_DIR", "LLMSERVE_CACHE_DIR",
    "LLMSERVE_STALL_TIMEOUT", "LLMSERVE_SSE_KEEPALIVE", "LLMSERVE_FAULT_INJECT",
    "LLMSERVE_FAULT_AFTER_STEPS", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF",
    "TOKENIZERS_PARALLELISM",
)
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _query_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    value = request.args.get(name, default)
    if value not in choices:
        raise bad_request(f"{name} must be one of {', '.join(choices)}, got {value[:100]!r}",
                          f"query.{name}")
    return value


def query_bool(name: str, default: bool) -> bool:
    value = request.args.get(name)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise bad_request(f"{name} must be a boolean, got {value[:100]!r}", f"query.{name}")


def _query_level() -> int:
    value = request.args.get("level", "1")
    try:
        level = int(value)
    except ValueError:
        level = -1
    if not 0 <= level <= 2:
        raise bad_request(f"level must be an integer from 0 to 2, got {value[:100]!r}",
                          "query.level")
    return level


async def control(srv: ServerState, command: str, **args: Any) -> Any:
    """Sends one command to the engine actor; a refusal becomes 400 (bad arguments), 409
    (not now) or 500. Returns the result's value."""
    assert srv.actors is not None  # the health gate answers 503 until the actors run
    result: ControlResult = await srv.actors.control(Control(command, tuple(args.items())))
    if not result.ok:
        status = {"invalid": 400, "conflict": 409}.get(result.reason or "", 500)
        raise APIError(status, result.error or f"{command} failed")
    return result.value


async def _optional_json() -> dict[str, Any]:
    """A JSON object body, or {} when there is none."""
    if not await request.get_data(cache=True):
        return {}
    return await read_json()


def register(app: Quart, srv: ServerState) -> None:
    if not srv.config.enable_dev_endpoints:
        return
    log.warning("SECURITY WARNING: the operator routes are enabled (pause, sleep, weight "
                "updates); keep this server off untrusted networks%s",
                "" if srv.config.api_keys else " and set --api-key")

    @app.post("/pause")
    async def pause() -> Response:
        mode = _query_choice("mode", PAUSE_MODES, "abort")
        await control(srv, "pause", mode=mode, clear_cache=query_bool("clear_cache", True))
        return json_response({"status": "paused"})

    @app.post("/resume")
    async def resume() -> Response:
        await control(srv, "resume")
        return json_response({"status": "resumed"})

    @app.get("/is_paused")
    async def is_paused() -> Response:
        return json_response({"is_paused": await control(srv, "is_paused")})

    @app.post("/abort_requests")
    async def abort_requests() -> Response:
        body = await read_json()
        ids = body.get("request_ids")
        if ids is not None and not (isinstance(ids, list)
                                    and all(isinstance(i, str) for i in ids)):
            raise bad_request("request_ids must be a list of strings", "request_ids")
        aborted = await control(srv, "abort_requests",
                                request_ids=request_names(ids) if ids else None)
        return json_response({"status": "aborted", "aborted": aborted})

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Response:
        # Blocks in use keep their KV and are simply not found again, so the reset never
        # has to wait for running requests (reset_running_requests changes nothing).
        query_bool("reset_running_requests", False)
        if query_bool("reset_external", False):
            raise bad_request("there is no external (connector) prefix cache to reset",
                              "query.reset_external")
        await control(srv, "reset_prefix_cache")
        return json_response({"success": True})

    @app.post("/reset_mm_cache")
    async def reset_mm_cache() -> Response:
        # No multimodal input is cached between requests here (audio is featurized per
        # request): nothing to drop. vLLM's answer: 200, no body.
        return Response(b"", status=200)

    @app.post("/reset_encoder_cache")
    async def reset_encoder_cache() -> Response:
        freed = (await control(srv, "reset_encoder_cache"))["freed_bytes"]
        log.info("encoder cache reset: %d bytes freed", freed)
        return Response(b"", status=200)

    @app.post("/release_kv_cache_memory")
    async def release_kv_cache_memory() -> Response:
        # reset_connector: there is no KV connector to reset; the value is checked all the same
        query_bool("reset_connector", True)
        await control(srv, "release_kv_cache_memory")
        return json_response({"status": "kv_cache_released"})

    @app.post("/sleep")
    async def sleep() -> Response:
        level = _query_level()
        mode = _query_choice("mode", PAUSE_MODES, "abort")
        await control(srv, "sleep", level=level, mode=mode)
        return json_response({"status": "sleeping", "level": level})

    @app.post("/wake_up")
    async def wake_up() -> Response:
        tags = request.args.getlist("tags") or None
        value = await control(srv, "wake_up", tags=None if tags is None else tuple(tags))
        return json_response({"status": "sleeping" if value["asleep"] else "awake",
                              "tags": tags})

    @app.get("/is_sleeping")
    async def is_sleeping() -> Response:
        return json_response({"is_sleeping": await control(srv, "is_sleeping")})

    @app.get("/server_info")
    async def server_info() -> Response:
        cfg = dataclasses.asdict(srv.config)
        cfg.pop("api_keys", None)  # never disclosed
        cfg = orjson.loads(orjson.dumps(cfg, default=str))  # paths and the like as text
        env = {k: os.environ[k] for k in SERVER_INFO_ENV if k in os.environ}
        return json_response({
            "config": str(cfg) if request.args.get("config_format") == "text" else cfg,
            "version": __version__,
            "env": env,
            "system": {"python": platform.python_version(), "platform": platform.platform(),
                       "cpu_count": os.cpu_count(), "rss_bytes": resident_bytes()},
            # Which kernel runs each linear shape at each batch size (chosen at load).
            "linear_routing": await control(srv, "linear_routing"),
        })

    @app.post("/collective_rpc")
    async def collective_rpc() -> Response:
        body = await _optional_json()
        method = body.get("method")
        if not isinstance(method, str):
            raise bad_request("Missing 'method' in request body", "method")
        if method not in RPC_METHODS:
            raise APIError(403, f"collective_rpc method {method[:100]!r} is not allowed; "
                                f"allowed: {', '.join(RPC_METHODS)}", param="method")
        if body.get("args") or body.get("kwargs"):
            raise bad_request(f"{method} takes no arguments", "args")
        return json_response({"results": [await control(srv, method)]})
