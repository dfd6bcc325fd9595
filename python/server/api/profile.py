"""/start_profile and /stop_profile, present only with ``--profiler-config`` (as vLLM gates
them): torch's profiler over the engine's steps, with the core's native calls as named
spans and per-call timers (actors.core.operator), written to ``torch_profiler_dir`` when
the session stops. Behind the API key when one is set (vLLM leaves them open).
"""

from __future__ import annotations

import logging
import re

from quart import Quart, Response, request

from server.api.dev import control
from server.api.http_io import read_json
from server.errors import bad_request
from server.state import ServerState

log = logging.getLogger("server.profile")

_PREFIX = re.compile(r"[A-Za-z0-9._-]{1,64}")


def register(app: Quart, srv: ServerState) -> None:
    config = srv.config.profiler_config
    if config is None:
        return
    log.warning("the torch profiler is served (/start_profile, /stop_profile), writing to "
                "%s: for local development only", config["torch_profiler_dir"])

    @app.post("/start_profile")
    async def start_profile() -> Response:
        # vLLM's body is optional and ignores fields it does not know (a completion body
        # sent by mistake starts a session); the overrides we cannot honour are refused.
        body = await read_json() if await request.get_data(cache=True) else {}
        prefix = body.get("profile_prefix")
        if prefix is not None and not (isinstance(prefix, str) and _PREFIX.fullmatch(prefix)):
            raise bad_request("profile_prefix must be 1-64 letters, digits, '.', '_' or '-'",
                              "profile_prefix")
        for name in ("delay_iterations", "profiler_kwargs"):
            if body.get(name) is not None:
                raise bad_request(f"{name} is not supported; start and stop the session "
                                  "around the requests to profile", name)
        # A session stops by itself after max_iterations engine steps (the config's, at
        # most) or once it has grown the process by max_profile_bytes.
        bound = int(config["max_iterations"])  # type: ignore[call-overload]
        steps = body.get("max_iterations")
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                                  or not 1 <= steps <= bound):
            raise bad_request(f"max_iterations must be an integer from 1 to {bound}",
                              "max_iterations")
        await control(srv, "start_profile", config=config, prefix=prefix,
                      max_iterations=steps)
        log.info("profiler started")
        return Response(b"", status=200)

    @app.post("/stop_profile")
    async def stop_profile() -> Response:
        written = await control(srv, "stop_profile")
        log.info("profiler stopped: %s, %s", written["trace"], written["core_timers"])
        return Response(b"", status=200)
