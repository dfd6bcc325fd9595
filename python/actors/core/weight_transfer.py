"""The core's side of vLLM's weight transfer for RL loops: init, start, update (chunks),
finish, the weight version and shutdown, applied between steps (actors.core.operator hands
them here).

    start_weight_update -> update_weights (any number of chunks) -> finish_weight_update

- **Staged, then swapped.** A chunk's tensors are checked (actors.core.weight_sources) and
  staged, converted to the serving dtype; nothing the engine runs changes. ``finish``
  builds the model anew from the checkpoint with every update so far over it (this one's
  staged tensors last), packs it as the load packed it (a GGUF-quantized or int8 matrix an
  update did not change stays quantized) and swaps it in whole between two steps. Requests
  in flight finish on the old weights up to that step and go on with the new ones after
  it (pause them first, mode wait or keep, to have them finish on the old weights or wait
  for the new ones); the prefix cache is reset, so KV of the old weights is never reused
  by a new request.
- **Order, as vLLM's workers keep it.** ``update`` or ``finish`` without a ``start``, and a
  second ``start``, are refused (``reason="rpc"``: vLLM's worker raises, its server
  answers 500) with vLLM's texts. An update that fails (a tensor refused: ``reason=
  "invalid"``) ends the session as vLLM's does, its staged tensors dropped and the served
  weights untouched: the trainer starts again. A ``finish`` whose build fails ends it too.
- **The weight version** is vLLM's label: "default" until ``update_weight_version`` or a
  ``finish`` with ``weight_version`` sets it; every step's outputs carry the label that was
  current when it ran (TokenBatch.weight_version), so a response can say which label
  sampled which of its tokens. Sleep level 2 drops the updates with the weights (wake_up
  reads the checkpoint again) and leaves the label as it is, as vLLM's does.
- **init_info** takes vLLM's IPC field ``packed`` (a wire parameter that means nothing for
  these transports); any other field is refused, with vLLM's text. There is no draft model
  (no speculative decoding), so ``start_draft_weight_update`` is refused with vLLM's text.
- **Bounds.** Staged tensors are keyed by name and each has the checkpoint's shape, so a
  session never stages more than one copy of the model, whatever a trainer sends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from actors.core.weight_sources import Catalog, WeightRefused, read_source
from actors.messages import ControlResult

if TYPE_CHECKING:
    from actors.core.operator import EngineHost

__all__ = ["ENGINE_NAME", "WeightTransfer"]

log = logging.getLogger("actors.core.weight_transfer")

ENGINE_NAME = "LocalWeightTransferEngine"
INIT_FIELDS = ("packed",)
DEFAULT_VERSION = "default"
NOT_STARTED_UPDATE = "start_weight_update must be called before update_weights."
NOT_STARTED_FINISH = "finish_weight_update called without a matching start_weight_update."
ALREADY_ACTIVE = ("start_weight_update called while a weight update is already active. "
                  "Call finish_weight_update first.")
SHUTDOWN_ACTIVE = "Cannot release a trainer connection during a weight update"
NO_DRAFT = "Draft model weight update requested, but no draft model is configured."
COMMANDS = ("init_weight_transfer_engine", "shutdown_weight_transfer_engine",
            "start_weight_update", "start_draft_weight_update", "update_weights",
            "finish_weight_update", "update_weight_version", "weight_info")


def _rpc(message: str) -> ControlResult:
    return ControlResult(False, error=message, reason="rpc")


class WeightTransfer:
    """One engine's weight-transfer session and version (see the module)."""

    def __init__(self, host: EngineHost, swap: Callable[[Any], None]) -> None:
        self._host = host
        self._swap = swap  # serves a model from the next step
        self.version = DEFAULT_VERSION
        self.packed = False
        self.active = False
        self._staged: dict[str, Any] = {}
        self._updates: dict[str, Any] = {}  # checkpoint name -> tensor, every update so far
        self._catalog: Catalog | None = None
        self.weights_asleep: Callable[[], bool] = lambda: False

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = Catalog.of_dir(self._host.origin.model_dir)
        return self._catalog

    def control(self, command: str, args: Mapping[str, Any]) -> ControlResult:
        match command:
            case "init_weight_transfer_engine":
                return self.init(args.get("init_info") or {})
            case "shutdown_weight_transfer_engine":
                if self.active:
                    return _rpc(SHUTDOWN_ACTIVE)
                self.packed = False
                return ControlResult(True)
            case "start_weight_update":
                return self.start()
            case "start_draft_weight_update":
                return _rpc(NO_DRAFT)
            case "update_weights":
                return self.update(args["source"])
            case "finish_weight_update":
                return self.finish(args.get("weight_version"))
            case "update_weight_version":
                self.version = str(args["new_version"])
                return ControlResult(True, {"weight_version": self.version})
            case "weight_info":
                return ControlResult(True, {"weight_version": self.version,
                                            "updated_tensors": len(self._updates),
                                            "update_active": self.active})
        return ControlResult(False, error=f"unknown control command {command!r}")

    def init(self, init_info: Mapping[str, Any]) -> ControlResult:
        unknown = [k for k in init_info if k not in INIT_FIELDS]
        if unknown:
            return _rpc(f"Invalid init_info for {ENGINE_NAME}: {ENGINE_NAME}InitInfo."
                        f"__init__() got an unexpected keyword argument {unknown[0]!r}")
        self.packed = bool(init_info.get("packed", False))
        return ControlResult(True)

    def start(self) -> ControlResult:
        if self.active:
            return _rpc(ALREADY_ACTIVE)
        if self.weights_asleep():
            return _rpc("the weights were dropped by sleep level 2; wake up first")
        self.active = True
        self._staged = {}
        return ControlResult(True)

    def update(self, source: Mapping[str, Any]) -> ControlResult:
        if not self.active:
            return _rpc(NOT_STARTED_UPDATE)
        dtype = self._host.origin.dtype
        fresh: dict[str, Any] = {}
        try:
            for name, tensor in read_source(source, self.catalog):
                fresh[name] = tensor.to(dtype)
        except WeightRefused as exc:
            self._end()
            return ControlResult(False, error=str(exc), reason="invalid")
        self._staged.update(fresh)
        return ControlResult(True, {"staged": len(self._staged)})

    def finish(self, weight_version: str | None) -> ControlResult:
        if not self.active:
            return _rpc(NOT_STARTED_FINISH)
        staged = self._staged
        self._end()
        if staged:
            merged = {**self._updates, **staged}
            try:
                model = self.build_model(merged)
            except Exception as exc:  # the served weights stay
                log.exception("building the updated model failed")
                return ControlResult(False, error=f"the updated model could not be built "
                                                  f"({type(exc).__name__}); the weights are "
                                                  "unchanged")
            self._swap(model)
            self._updates = merged
            self._host.reset_prefix_cache(publish=False)  # KV of the old weights is stale
        if weight_version is not None:
            self.version = str(weight_version)
        log.info("weight update finished: %d tensors swapped in, version %r", len(staged),
                 self.version)
        return ControlResult(True, {"weight_version": self.version, "updated": len(staged)})

    def forget_updates(self) -> None:
        """Sleep level 2 dropped the weights: a wake_up reads the checkpoint alone."""
        self._updates.clear()
        self._end()

    def _end(self) -> None:
        self.active = False
        self._staged = {}

    def build_model(self, updates: Mapping[str, Any]) -> Any:
        """The checkpoint's model again, with `updates` over it, stored as the load stored
        it: a quantized matrix (--quantization gguf, int8) comes back quantized, except one
        an update actually changed, which is packed from the update's values."""
        import torch

        from actors.loader.hf import iter_weights, safetensors_files
        from actors.models.config import ModelConfig
        from actors.models.registry import build_model

        origin = self._host.origin
        quant = origin.quantization
        cfg = ModelConfig.from_dir(origin.model_dir)
        load_dtype = torch.float32 if quant == "int8" else origin.dtype
        model = build_model(cfg, dtype=load_dtype)
        files = safetensors_files(origin.model_dir)
        changed: set[str] = set()

        def merged(name: str, t: Any) -> Any:
            new = updates.get(name)
            if new is None:
                return t
            if not torch.equal(new.to(t.dtype), t):
                changed.add(name.removesuffix(".weight").removesuffix(".bias"))
            return new

        model.load_weights((name, merged(name, t)) for name, t in iter_weights(files, load_dtype))
        if quant == "gguf":
            import json

            from actors.loader.gguf import matrix_parts, quantized_weights

            hf_cfg = json.loads((origin.model_dir / "config.json").read_text())
            kept = quantized_weights(origin.source, hf_cfg)
            model.pack_weights({k: w for k, w in kept.items()
                                if not changed.intersection(matrix_parts(k))})
        elif quant == "int8":
            from actors.loader.int8 import int8_weights

            model.pack_weights(int8_weights(model))
        else:
            model.pack_weights()
        return model
