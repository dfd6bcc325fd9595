"""vLLM's weight transfer for RL trainers (verl, OpenRLHF, TRL): the dev-mode routes that
push new weights into a serving engine between two of its steps.

    POST /init_weight_transfer_engine   {"init_info": {...}}
                                        -> {"message": "Weight transfer initialized"}
    POST /start_weight_update           -> {"message": "Weight update started"}
    POST /update_weights                {"update_info": {...}}, or a safetensors chunk
                                        -> {"message": "Weights updated"}
    POST /finish_weight_update          {"weight_version": str | null}
                                        -> {"message": "Weight update finished"}
    POST /update_weight_version         {"new_version": str}
                                        -> {"success": true, "new_version": str}
    GET  /weight_info                   -> {"weight_version": "default"}
    GET  /get_world_size?include_dp=    -> {"world_size": N}
    POST /shutdown_weight_transfer_engine -> {"message": "Weight transfer shut down"}
    POST /start_draft_weight_update     (no draft model here: refused, as vLLM refuses it)

The transports are local, no NCCL and no CUDA IPC (actors.core.weight_sources):
``update_info`` is ``{"path": file or directory of .safetensors}`` or a shared-memory
segment laid out as vLLM's packed IPC buffer, ``{"shm_name", "names", "dtype_names",
"shapes", "tensor_sizes"?}``. A remote trainer uploads instead: the body of ``POST
/update_weights`` with ``Content-Type: application/octet-stream`` is one safetensors file
(a chunk: any subset of the tensors), at most --max-weight-chunk-bytes (413 above, before
it is read). Tensor names are the checkpoint's (Hugging Face names, as a trainer's
``state_dict()`` has them; a GGUF model's are those its conversion wrote, the same names).

Nothing reaches an engine that it would refuse: a body that is not an object, a chunk whose
safetensors framing is broken, IPC handles (never unpickled) are refused here. A refused
``update_info`` or chunk still ends the update session, as a failed update ends vLLM's: the
edge tells the engines so (the source ``refused``), and they answer in vLLM's order (no
session: the 500 below). A body without ``update_info`` (vLLM's request validation) ends
nothing. Each tensor's name, shape and dtype are checked against the model by the core
before anything is staged: a mismatch is a 400 naming the tensor, the served weights
untouched. Calls out of order (an update or a finish with no start, a second start) are
answered as vLLM's server answers them: 500, ``Call to collective_rpc method failed: ``
and its worker's text. Every command goes to every data-parallel engine
(actors.runtime.data_parallel). In-flight requests and the version labels on responses:
actors.core.weight_transfer.
"""

from __future__ import annotations

from typing import Any

from actors.core.weight_sources import TORCH_NAMES, WeightRefused, safetensors_header
from actors.messages import Control, ControlResult
from quart import Quart, Response, request

from server.api.dev import query_bool
from server.api.http_io import json_response, read_json, upload_request_class
from server.errors import APIError, bad_request
from server.state import ServerState

RPC_FAILED = "Call to collective_rpc method failed: "
CHUNK_TYPES = ("application/octet-stream", "application/x-safetensors")
FORMS = ('update_info must be {"path": <a .safetensors file or a directory of them>} or a '
         'shared-memory segment {"shm_name", "names", "dtype_names", "shapes"}; or upload '
         "a safetensors chunk as the body (Content-Type: application/octet-stream)")


async def rpc(srv: ServerState, command: str, **args: Any) -> Any:
    """One weight-transfer command to every engine: 400 for a refused tensor, 500 in vLLM's
    words for a call out of order, 409 for an engine state that forbids it."""
    assert srv.actors is not None  # the health gate answers 503 until the actors run
    result: ControlResult = await srv.actors.control(Control(command, tuple(args.items())))
    if result.ok:
        return result.value
    message = result.error or f"{command} failed"
    if result.reason == "invalid":
        raise APIError(400, message, param="update_info")
    if result.reason == "rpc":
        raise APIError(500, RPC_FAILED + message)
    raise APIError(409 if result.reason == "conflict" else 500, message)


async def _body_or_empty() -> dict[str, Any]:
    if not await request.get_data(cache=True):
        return {}
    return await read_json()


def _json_source(info: Any) -> dict[str, Any]:
    """The core's source for a JSON update_info; 400 for anything else."""
    if isinstance(info, list):
        raise bad_request("a list of update_info (one per worker rank) is for CUDA IPC; "
                          "every engine here takes the same update: send one object",
                          "update_info")
    if "ipc_handles" in info or "ipc_handles_pickled" in info:
        raise bad_request("CUDA IPC handles cannot be opened here (no GPU transport; pickled "
                          "handles are never unpickled): put the tensors in a shared-memory "
                          "segment (shm_name) or a safetensors file, or upload them",
                          "update_info")
    if "path" in info:
        if not isinstance(info["path"], str) or not info["path"]:
            raise bad_request("update_info.path must be a non-empty string", "update_info.path")
        return {"kind": "path", "path": info["path"]}
    if "shm_name" in info:
        return _shm_source(info)
    if "names" in info:
        raise bad_request("update_info names tensors but not where they are: no NCCL "
                          "broadcast here; " + FORMS, "update_info")
    raise bad_request(FORMS, "update_info")


def _shm_source(info: dict[str, Any]) -> dict[str, Any]:
    name = info["shm_name"]
    if not isinstance(name, str):
        raise bad_request("update_info.shm_name must be a string", "update_info.shm_name")
    names, dtypes, shapes = info.get("names"), info.get("dtype_names"), info.get("shapes")
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise bad_request("update_info.names must be a list of tensor names",
                          "update_info.names")
    for field, value in (("dtype_names", dtypes), ("shapes", shapes)):
        if not isinstance(value, list) or len(value) != len(names):
            got = len(value) if isinstance(value, list) else "none"
            raise bad_request(f"`{field}` should be of the same size as `names`: got {got} "
                              f"and {len(names)}", f"update_info.{field}")
    bad_dtype = next((d for d in dtypes if d not in TORCH_NAMES), None)
    if bad_dtype is not None:
        raise bad_request(f"dtype {str(bad_dtype)[:40]!r} is not one of "
                          f"{', '.join(TORCH_NAMES)}", "update_info.dtype_names")
    if not all(isinstance(s, list) and all(type(d) is int and d >= 0 for d in s)
               for s in shapes):
        raise bad_request("update_info.shapes must be lists of non-negative integers",
                          "update_info.shapes")
    sizes = info.get("tensor_sizes")
    if sizes is not None and not (isinstance(sizes, list) and len(sizes) == len(names)
                                  and all(type(n) is int for n in sizes)):
        raise bad_request("update_info.tensor_sizes must be one integer per name",
                          "update_info.tensor_sizes")
    return {"kind": "shm", "shm_name": name, "names": names, "dtype_names": dtypes,
            "shapes": shapes, "tensor_sizes": sizes}


async def _chunk_source() -> dict[str, Any]:
    """An uploaded safetensors chunk whose framing holds, else the refusal for the core."""
    data = await request.get_data(cache=False)
    try:
        entries, _ = safetensors_header(data)
        if not entries:
            raise WeightRefused("the chunk holds no tensors")
    except WeightRefused as exc:
        return {"kind": "refused", "error": f"chunk: {exc}"}
    return {"kind": "chunk", "data": data}


def register(app: Quart, srv: ServerState) -> None:
    cfg = srv.config
    if not cfg.enable_dev_endpoints:
        return
    app.request_class = upload_request_class(
        app.request_class, frozenset({"/update_weights"}),
        max(cfg.max_weight_chunk_bytes, cfg.max_body_bytes))

    @app.post("/init_weight_transfer_engine")
    async def init_weight_transfer_engine() -> Response:
        init_info = (await read_json()).get("init_info")
        if not isinstance(init_info, dict):
            raise bad_request("init_info is required: an object (the backend's init "
                              "fields)", "init_info")
        await rpc(srv, "init_weight_transfer_engine", init_info=init_info)
        return json_response({"message": "Weight transfer initialized"})

    @app.post("/shutdown_weight_transfer_engine")
    async def shutdown_weight_transfer_engine() -> Response:
        await rpc(srv, "shutdown_weight_transfer_engine")
        return json_response({"message": "Weight transfer shut down"})

    @app.post("/start_weight_update")
    async def start_weight_update() -> Response:
        await rpc(srv, "start_weight_update")
        return json_response({"message": "Weight update started"})

    @app.post("/start_draft_weight_update")
    async def start_draft_weight_update() -> Response:
        await rpc(srv, "start_draft_weight_update")
        return json_response({"message": "Draft weight update started"})

    @app.post("/update_weights")
    async def update_weights() -> Response:
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        refusal: APIError | None = None
        if ctype in CHUNK_TYPES:
            source = await _chunk_source()
        else:
            length = request.content_length
            if length is not None and length > cfg.max_body_bytes:
                raise APIError(413, "The request body is too large.",
                               headers={"Connection": "close"})
            info = (await read_json()).get("update_info")
            if not isinstance(info, (dict, list)):  # the body's shape: vLLM's 400 too
                raise bad_request("update_info is required: " + FORMS, "update_info")
            try:
                source = _json_source(info)
            except APIError as exc:  # its content: ends the session, as vLLM's worker
                refusal, source = exc, {"kind": "refused", "error": exc.message}
        try:
            await rpc(srv, "update_weights", source=source)
        except APIError as exc:
            if refusal is not None and exc.status == 400:
                raise refusal from None  # with its own param
            raise
        return json_response({"message": "Weights updated"})

    @app.post("/finish_weight_update")
    async def finish_weight_update() -> Response:
        version = (await _body_or_empty()).get("weight_version")
        if version is not None and not isinstance(version, str):
            raise bad_request("weight_version must be a string or null", "weight_version")
        await rpc(srv, "finish_weight_update", weight_version=version)
        return json_response({"message": "Weight update finished"})

    @app.post("/update_weight_version")
    async def update_weight_version() -> Response:
        version = (await read_json()).get("new_version")
        if not isinstance(version, str):
            raise bad_request("new_version is required: a string", "new_version")
        await rpc(srv, "update_weight_version", new_version=version)
        return json_response({"success": True, "new_version": version})

    @app.get("/weight_info")
    async def weight_info() -> Response:
        value = await rpc(srv, "weight_info")
        return json_response({"weight_version": value["weight_version"]})

    @app.get("/get_world_size")
    async def get_world_size() -> Response:
        # tensor and pipeline parallelism are 1: the world is the data-parallel engines
        include_dp = query_bool("include_dp", True)
        return json_response({"world_size": cfg.data_parallel_size if include_dp else 1})
