"""Response shape of /v1/models."""

from __future__ import annotations

from typing import Any


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
