"""The scale-out routes of vLLM 0.33 ("disaggregated everything"): prompt rendering without
generation (`render`), token ids in and out (`generate`, with abort), detokenizing a
generate response into an OpenAI one (`derender`).

They are served under `--enable-scale-out` or `--tokens-only`; otherwise every one of them
answers 403 with vLLM's message, before its body is read.
"""

from __future__ import annotations

from quart import Quart, Response

from server.api.scale_out import derender, generate, messages_render, render
from server.errors import APIError
from server.state import ServerState

ROUTE_MODULES = (render, messages_render, derender, generate)
DISABLED = ("Scale-out endpoints are disabled. Restart the server with --enable-scale-out "
            "to enable them.")


def register(app: Quart, srv: ServerState) -> None:
    cfg = srv.config
    if cfg.enable_scale_out or cfg.tokens_only:
        for module in ROUTE_MODULES:
            module.register(app, srv)
        return

    async def disabled() -> Response:
        raise APIError(403, DISABLED)

    disabled.undocumented = True  # type: ignore[attr-defined]  # as vLLM: not in the schema

    for module in ROUTE_MODULES:
        for path in module.PATHS:
            app.add_url_rule(path, f"scale_out_disabled:{path}", disabled, methods=["POST"])
