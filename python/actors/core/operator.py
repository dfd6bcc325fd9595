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
- **Weight updates** (vLLM's RL weight transfer: start, update in chunks, finish, the
  weight version) are actors.core.weight_transfer's: staged, then swapped in whole.
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
from actors.core.weight_transfer import COMMANDS as WEIGHT_COMMANDS
from actors.core.weight_transfer import WeightTransfer
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
        self.weights = WeightTransfer(host, self._swap_model)
        self.weights.weights_asleep = lambda: "weights" in self.asleep
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
            case name if name in WEIGHT_COMMANDS:
                return self.weights.control(name, args)
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
            self.weights.forget_updates()  # level 2 gives the weights up: wake reads the disk
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
            self._swap_model(self.weights.build_model({}))  # the checkpoint's weights
            self.asleep.discard("weights")
        if "kv_cache" in wanted and "kv_cache" in self.asleep:
            self._host.restore_kv_cache()
            self.asleep.discard("kv_cache")
        return ControlResult(True, {"asleep": sorted(self.asleep), "rss_before": before,
                                    "rss_after": resident_bytes()})

    # ------------------------------------------------------------------ weights

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

