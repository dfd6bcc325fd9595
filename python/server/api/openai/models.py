"""GET /v1/models: the served model names, one card each."""

from __future__ import annotations

from typing import Any

from quart import Quart, Response

from server.api import lora
from server.api.http_io import json_response
from server.state import ServerState


def model_card(name: str, root: str, created: int, max_model_len: int) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "llmserve",
        "root": root,
        "parent": None,
        "max_model_len": max_model_len,
    }


def register(app: Quart, srv: ServerState) -> None:
    @app.get("/v1/models")
    async def models() -> Response:
        limits = srv.limits
        assert limits is not None
        cards = [model_card(name, srv.model_root, int(srv.started_at), limits.max_model_len)
                 for name in srv.config.served_model_names]
        cards += lora.cards(srv, int(srv.started_at))
        return json_response({"object": "list", "data": cards})
