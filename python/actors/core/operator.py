"""The core's operator commands: the prefix and encoder caches, memory (sleep, wake, the
KV cache's release), the weights (update, version), LoRA adapters, the linear routing table
and the profiler.

``LLMEngine.control`` hands every ``Control`` here. The engine actor applies them only
between steps and only once nothing runs that they would break (sleep needs an empty
core: the actor aborts or drains first), in a worker thread, since a weight load takes
seconds. The operator reaches the engine only through ``EngineHost``: a few verbs (drop
or restore the KV cache, swap the model, reset the prefix cache) and read-only facts; it
never writes the engine's fields.

- **Sleep** level 1 frees the KV cache tensors (and forgets every cached prefix, whose
  contents are gone); level 2 also drops the model. glibc keeps freed heap pages unless
  asked, so both end with ``malloc_trim``: the process's RSS falls by what was resident.
  Wake reallocates the KV cache (zeroed, so pages come back as they are written) and, after
  level 2, builds the model again from the checkpoint on disk. **release_kv_cache_memory**
  (vLLM's, for RL loops: pause, release, update the weights, wake) is level 1's KV part
  after a completed pause, with the caches reset first; wake_up restores it.
- **The encoder cache** is Whisper's cross-attention K/V pool (core/runner/cross_kv.py):
  per live window, so a reset drops the pool's memory only when no window is running.
- **Weight updates** take a safetensors file (or a directory of them) with checkpoint names
  and shapes. Every tensor is checked against the checkpoint on disk before anything
  changes; the model is then built anew from the checkpoint with every update so far
  applied, packed, and swapped in whole, so a failure leaves the old weights serving. The
  prefix cache is reset: KV computed under the old weights is never reused.
- **Profiling**: actors.core.profiler.
"""

from __future__ import annotations

import ctypes
import gc
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from actors.core.profiler import ProfileSession, resident_bytes
from actors.messages import Control, ControlResult

if TYPE_CHECKING:
    import torch

    from actors.core.lora_adapters import LoraAdapters
    from actors.models.linear_routing import RoutingTable

__all__ = ["EngineHost", "Operator", "WeightOrigin", "resident_bytes"]

log = logging.getLogger("actors.core.operator")

WAKE_TAGS = ("weights", "kv_cache")


@dataclass(frozen=True, slots=True)
class WeightOrigin:
    """Where the serving weights came from: what a rebuild reads again."""

    model_dir: Path
    dtype: torch.dtype
    quantization: str | None
    source: Path  # what the loader was named (a directory or a .gguf file)


class EngineHost(Protocol):
    """What the operator may see of the engine and ask of it."""

    @property
    def origin(self) -> WeightOrigin: ...
    @property
    def linear_routing(self) -> RoutingTable | None: ...
    @property
    def lora(self) -> LoraAdapters | None: ...
    def has_unfinished(self) -> bool: ...
    def reset_prefix_cache(self, *, publish: bool) -> None: ...
    def free_kv_cache(self) -> None: ...
    def reset_encoder_cache(self) -> int: ...
    def restore_kv_cache(self) -> None: ...
    def swap_model(self, model: torch.nn.Module | None) -> None: ...


def _trim_heap() -> None:
    """Hands freed heap pages back to the OS (glibc keeps them otherwise)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _invalid(message: str) -> ControlResult:
    return ControlResult(False, error=message, reason="invalid")


def _conflict(message: str) -> ControlResult:
    return ControlResult(False, error=message, reason="conflict")


class Operator:
    def __init__(self, host: EngineHost) -> None:
        self._host = host
        self.asleep: set[str] = set()  # of WAKE_TAGS
        self.weight_version = 0
        self._updates: dict[str, Any] = {}  # checkpoint name -> tensor, every update so far
        self._profile: ProfileSession | None = None
        self._bounded: dict[str, Any] | None = None  # what a session stopped at a bound wrote

    def control(self, command: Control) -> ControlResult:
        """Applies one operator command between steps."""
        args, host = dict(command.args), self._host
        match command.command:
            case "reset_prefix_cache":  # blocks in use stay; they are simply not found again
                host.reset_prefix_cache(publish=True)
                return ControlResult(True)
            case "reset_encoder_cache":
                freed = host.reset_encoder_cache()
                if freed:
                    _trim_heap()
                return ControlResult(True, {"freed_bytes": freed})
            case "release_kv_cache_memory":
                return self.release_kv_cache_memory()
            case "sleep":
                return self.sleep(int(args.get("level", 1)))
            case "wake_up":
                return self.wake_up(args.get("tags"))
            case "update_weights":
                return self.update_weights(str(args.get("path", "")))
            case "weight_info":
                return self.weight_info()
            case "linear_routing":
                table = host.linear_routing
                return ControlResult(True, None if table is None else table.as_dict())
            case "start_profile":
                return self.start_profile(args["config"], args.get("prefix"),
                                          args.get("max_iterations"))
            case "stop_profile":
                return self.stop_profile()
            case "load_lora_adapter" | "unload_lora_adapter" if host.lora is None:
                return _invalid("LoRA is not enabled (--enable-lora)")
            case "load_lora_adapter":
                return host.lora.load(int(args["lora_id"]), str(args["path"]))
            case "unload_lora_adapter":
                return host.lora.unload(int(args["lora_id"]))
        return ControlResult(False, error=f"unknown control command {command.command!r}")

    # ------------------------------------------------------------------ sleep

    def sleep(self, level: int) -> ControlResult:
        host = self._host
        if level not in (0, 1, 2):
            return _invalid(f"sleep level must be 0, 1 or 2, got {level}")
        if level >= 1 and host.has_unfinished():
            return _conflict("requests still hold the KV cache; abort or drain them first")
        before = resident_bytes()
        if level >= 1 and "kv_cache" not in self.asleep:
            host.free_kv_cache()  # and the cached prefixes, whose KV is gone
            self.asleep.add("kv_cache")
        if level == 2 and "weights" not in self.asleep:
            host.swap_model(None)
            self._updates.clear()  # level 2 gives the weights up: wake reads the disk
            self.asleep.add("weights")
        _trim_heap()
        after = resident_bytes()
        log.info("sleep level %d: RSS %.1f -> %.1f MiB", level, before / 2**20, after / 2**20)
        return ControlResult(True, {"level": level, "rss_before": before, "rss_after": after})

    def release_kv_cache_memory(self) -> ControlResult:
        """vLLM's release_kv_cache_memory: after a completed pause, the caches are reset (the
        prefix cache published as cleared, the encoder cache) and the KV cache freed, the
        weights kept; wake_up (tag kv_cache) brings it back."""
        host = self._host
        if self.asleep:
            return _conflict("release_kv_cache_memory requires all memory to be resident; "
                             f"{', '.join(sorted(self.asleep))} sleeps (wake up first)")
        if host.has_unfinished():
            return _conflict("release_kv_cache_memory requires a completed pause first")
        before = resident_bytes()
        host.reset_prefix_cache(publish=True)
        host.reset_encoder_cache()
        host.free_kv_cache()
        self.asleep.add("kv_cache")
        _trim_heap()
        after = resident_bytes()
        log.info("release_kv_cache_memory: RSS %.1f -> %.1f MiB", before / 2**20, after / 2**20)
        return ControlResult(True, {"rss_before": before, "rss_after": after})

    def wake_up(self, tags: tuple[str, ...] | None) -> ControlResult:
        """Restores the parts named (all when None); the value says what still sleeps."""
        unknown = sorted(set(tags or ()) - {*WAKE_TAGS, "scheduling"})
        if unknown:
            return _invalid(f"unknown wake_up tags: {', '.join(unknown)} "
                            f"(known: {', '.join(WAKE_TAGS)}, scheduling)")
        wanted = set(WAKE_TAGS) if tags is None else set(tags)
        before = resident_bytes()
        if "weights" in wanted and "weights" in self.asleep:
            self._swap_model(self._build_model({}))
            self.weight_version += 1  # the checkpoint's weights, not the updated ones
            self.asleep.discard("weights")
        if "kv_cache" in wanted and "kv_cache" in self.asleep:
            self._host.restore_kv_cache()
            self.asleep.discard("kv_cache")
        return ControlResult(True, {"asleep": sorted(self.asleep), "rss_before": before,
                                    "rss_after": resident_bytes()})

    # ------------------------------------------------------------------ weights

    def update_weights(self, path: str) -> ControlResult:
        if "weights" in self.asleep:
            return _conflict("the weights were dropped by sleep level 2; wake up first")
        try:
            files = _update_files(Path(path))
        except (FileNotFoundError, ValueError) as exc:
            return _invalid(str(exc))
        expected = _checkpoint_shapes(self._host.origin.model_dir)
        dtype = self._host.origin.dtype
        update: dict[str, Any] = {}
        from safetensors import SafetensorError, safe_open

        try:
            for f in files:
                with safe_open(str(f), framework="pt") as st:
                    for name in st.keys():
                        if name not in expected:
                            return _invalid(f"{f.name}: {name!r} is not a weight of this model")
                        shape = tuple(st.get_slice(name).get_shape())
                        if shape != expected[name]:
                            return _invalid(f"{f.name}: {name!r} has shape {list(shape)}, the "
                                            f"model's is {list(expected[name])}")
                        update[name] = st.get_tensor(name).to(dtype)
        except SafetensorError as exc:
            return _invalid(f"not a readable safetensors file: {exc}")
        if not update:
            return _invalid(f"{path} holds no tensors")
        merged = {**self._updates, **update}
        self._swap_model(self._build_model(merged))
        self._updates = merged
        self.weight_version += 1
        self._host.reset_prefix_cache(publish=False)  # KV of the old weights is stale
        return ControlResult(True, {"weight_version": self.weight_version,
                                    "updated": sorted(update)})

    def weight_info(self) -> ControlResult:
        return ControlResult(True, {"weight_version": self.weight_version,
                                    "updated_tensors": len(self._updates)})

    def _build_model(self, updates: Mapping[str, Any]) -> Any:
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

    def _swap_model(self, model: Any) -> None:
        self._host.swap_model(model)
        _trim_heap()  # the old model's packed weights

    # ------------------------------------------------------------------ profiler

    @property
    def profiling(self) -> bool:
        return self._profile is not None

    def start_profile(self, config: Mapping[str, Any], prefix: str | None,
                      max_iterations: int | None = None) -> ControlResult:
        if self._profile is not None:
            return _conflict("A profiling session is already active. Call /stop_profile "
                             "before starting another session.")
        self._profile = ProfileSession(config, prefix, max_iterations)
        self._bounded = None
        return ControlResult(True)

    def stop_profile(self) -> ControlResult:
        if self._profile is None:
            if self._bounded is not None:  # it reached a bound and wrote its trace then
                written, self._bounded = self._bounded, None
                return ControlResult(True, written)
            return _conflict("no profiling session is active; call /start_profile first")
        session, self._profile = self._profile, None
        return ControlResult(True, session.stop())

    def after_step(self) -> None:
        """Counts one engine step of an open profiling session; at its bound (steps, or
        resident memory grown while recording) the session stops and writes its trace, so
        a session nobody stops cannot grow without end. /stop_profile then reports it."""
        session = self._profile
        if session is None or not session.at_bound():
            return
        self._profile = None
        self._bounded = session.stop()
        log.warning("profiling stopped at its bound (%s); trace in %s", session.bound_hit,
                    self._bounded["trace"])


def _update_files(path: Path) -> list[Path]:
    from actors.loader.hf import safetensors_files

    if path.is_dir():
        return safetensors_files(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    if path.suffix != ".safetensors":
        raise ValueError(f"{path} is not a .safetensors file")
    return [path]


def _checkpoint_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    from actors.loader.hf import safetensors_files

    shapes: dict[str, tuple[int, ...]] = {}
    for f in safetensors_files(model_dir):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                shapes[name] = tuple(st.get_slice(name).get_shape())
    return shapes
