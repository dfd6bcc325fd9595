"""LoRA adapters on the HTTP side: the served adapter names, ``model: <adapter>`` routing,
their /v1/models cards, and the runtime /v1/load_lora_adapter and /v1/unload_lora_adapter.

Names live here; weights live in the engine core (actors.core.lora_adapters), reached by
one typed ``Control`` per load or unload, applied between steps. Every load gets a fresh
integer id, never reused: the id keys the prefix cache, so an adapter loaded again (also
``load_inplace``) never finds KV computed under its old weights (vLLM reuses the id in
place and warns that stale cached blocks may be served).

Unloading forgets the name at once (new requests for it get 404) and never fails a
request in flight: the core keeps the adapter's slot until no sequence runs under it.

As vLLM: the runtime routes exist only with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 (or
``--allow-runtime-lora-updating``), answer 200 with a plain-text line, and refuse a
missing name or path, a name clashing with the base model or already loaded (400), an
unknown name on unload (404) and a path with no adapter (404). Unlike vLLM, an adapter the
engine cannot serve (a bad format, a rank above --max-lora-rank) is the client's 400, not a
500, and every route needs the API key when one is set.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from actors.messages import Control, ControlResult
from actors.params.sampling import SamplingParams
from pydantic import BaseModel
from quart import Quart, Response

from server.api.http_io import accepts, parse, read_json
from server.errors import APIError, LoadRefused
from server.state import ServerState

log = logging.getLogger("server.lora")


@dataclass
class LoraNames:
    """Served adapter name -> (core id, path), in load order."""

    adapters: dict[str, tuple[int, str]] = field(default_factory=dict)
    next_id: int = 1
    lock: trio.Lock = field(default_factory=trio.Lock)  # one load or unload at a time


def names_of(srv: ServerState) -> LoraNames:
    if srv.lora_names is None:
        srv.lora_names = LoraNames()
    return srv.lora_names


def with_adapter(srv: ServerState, model: str, params: SamplingParams) -> SamplingParams:
    """params running under the adapter ``model`` names (unchanged for the base model)."""
    found = names_of(srv).adapters.get(model)
    return params if found is None else dataclasses.replace(params, lora_id=found[0])


def cards(srv: ServerState, created: int) -> list[dict[str, Any]]:
    """/v1/models cards of the adapters: parent = the base model, root = the adapter path."""
    base = srv.config.served_model_names[0]
    return [{"id": name, "object": "model", "created": created, "owned_by": "llmserve",
             "root": path, "parent": base, "max_model_len": None}
            for name, (_, path) in names_of(srv).adapters.items()]


class LoadLoRAAdapterRequest(BaseModel):
    lora_name: str | None = None
    lora_path: str | None = None
    load_inplace: bool = False


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str | None = None
    lora_int_id: int | None = None


async def _control(srv: ServerState, command: str, **args: Any) -> ControlResult:
    assert srv.actors is not None  # the health gate answers 503 until the actors run
    return await srv.actors.control(Control(command, tuple(args.items())))


async def load(srv: ServerState, name: str | None, path: str | None,
               inplace: bool = False) -> str:
    """Loads an adapter under ``name``; raises APIError with vLLM's message and status."""
    async with names_of(srv).lock:
        return await _load(srv, name, path, inplace)


async def _load(srv: ServerState, name: str | None, path: str | None, inplace: bool) -> str:
    if not name or not path:
        raise APIError(400, "Both 'lora_name' and 'lora_path' must be provided.")
    if name in srv.config.served_model_names:
        raise APIError(400, f"The lora adapter '{name}' conflicts with a served base model.")
    names = names_of(srv)
    previous = names.adapters.get(name)
    if previous is not None and not inplace:
        raise APIError(400, f"The lora adapter '{name}' has already been loaded. If you want "
                       "to load the adapter in place, set 'load_inplace' to True.")
    if not Path(path).is_dir():
        raise APIError(404, f"Loading lora {name} failed: No adapter found for {path}")
    lora_id, names.next_id = names.next_id, names.next_id + 1
    # Shielded: a client that gives up mid-load must not leave a loaded slot that no name
    # points to (it could never be unloaded); the load finishes and is registered.
    with trio.CancelScope(shield=True):
        result = await _control(srv, "load_lora_adapter", lora_id=lora_id, path=path)
        if not result.ok:
            status = {"invalid": 400, "conflict": 409}.get(result.reason or "", 500)
            raise APIError(status, f"Loading lora {name} failed: {result.error}")
        names.adapters[name] = (lora_id, path)
        if previous is not None:  # in place: the old weights retire once nothing uses them
            await _control(srv, "unload_lora_adapter", lora_id=previous[0])
    log.info("loaded LoRA adapter %r from %s (id %d)", name, path, lora_id)
    return f"Success: LoRA adapter '{name}' added successfully."


async def unload(srv: ServerState, name: str | None) -> str:
    async with names_of(srv).lock:
        return await _unload(srv, name)


async def _unload(srv: ServerState, name: str | None) -> str:
    if not name:
        raise APIError(400, "'lora_name' needs to be provided to unload a LoRA adapter.")
    found = names_of(srv).adapters.pop(name, None)
    if found is None:
        raise APIError(404, f"The lora adapter '{name}' cannot be found.")
    with trio.CancelScope(shield=True):  # the name is gone: the slot must go too
        result = await _control(srv, "unload_lora_adapter", lora_id=found[0])
    if not result.ok:  # the core did not know it: the name is gone either way
        log.warning("unloading LoRA adapter %r: %s", name, result.error)
    log.info("unloaded LoRA adapter %r", name)
    return f"Success: LoRA adapter '{name}' removed successfully."


async def load_startup_modules(srv: ServerState) -> None:
    """--lora-modules, loaded before the server answers; a failure stops the start."""
    for name, path in srv.config.lora_modules:
        try:
            await load(srv, name, path)
        except APIError as exc:
            raise LoadRefused(f"--lora-modules {name}={path}: {exc.message}") from None


def register(app: Quart, srv: ServerState) -> None:
    if not srv.config.allow_runtime_lora_updating:
        return
    log.warning("runtime LoRA updating is enabled: clients can load adapters from any "
                "path this server can read%s", "" if srv.config.api_keys else
                "; set --api-key")

    @app.post("/v1/load_lora_adapter")
    @accepts(LoadLoRAAdapterRequest)
    async def load_lora_adapter() -> Response:
        req = parse(LoadLoRAAdapterRequest, await read_json())
        return Response(await load(srv, req.lora_name, req.lora_path, req.load_inplace),
                        status=200)

    @app.post("/v1/unload_lora_adapter")
    @accepts(UnloadLoRAAdapterRequest)
    async def unload_lora_adapter() -> Response:
        req = parse(UnloadLoRAAdapterRequest, await read_json())
        return Response(await unload(srv, req.lora_name), status=200)
