"""The core's half of the operator commands: its memory (sleep, wake), its weights
(update, version) and the profiler.

``LLMEngine.control`` hands these commands here. The engine actor applies them only
between steps and only once nothing runs that they would break (sleep needs an empty
core: the actor aborts or drains first), in a worker thread, since a weight load takes
seconds.

- **Sleep** level 1 frees the KV cache tensors (and forgets every cached prefix, whose
  contents are gone); level 2 also drops the model. glibc keeps freed heap pages unless
  asked, so both end with ``malloc_trim``: the process's RSS falls by what was resident.
  Wake reallocates the KV cache (zeroed, so pages come back as they are written) and, after
  level 2, builds the model again from the checkpoint on disk.
- **Weight updates** take a safetensors file (or a directory of them) with checkpoint names
  and shapes. Every tensor is checked against the checkpoint on disk before anything
  changes; the model is then built anew from the checkpoint with every update so far
  applied, packed, and swapped in whole, so a failure leaves the old weights serving. The
  prefix cache is reset: KV computed under the old weights is never reused.
- **Profiling** runs torch's profiler over every thread (steps run in worker threads) and
  wraps the core's native entry points with ``record_function`` spans and per-call timers;
  stop writes the trace and ``<name>_core_timers.json`` into the configured directory.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import json
import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actors.config import PROFILE_MAX_BYTES, PROFILE_MAX_ITERATIONS
from actors.messages import ControlResult

if TYPE_CHECKING:
    from actors.core.engine import LLMEngine

__all__ = ["Operator", "resident_bytes"]

log = logging.getLogger("actors.core.operator")

WAKE_TAGS = ("weights", "kv_cache")


def resident_bytes() -> int:
    """This process's resident set size (VmRSS), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


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
    def __init__(self, engine: LLMEngine) -> None:
        self._engine = engine
        self.asleep: set[str] = set()  # of WAKE_TAGS
        self.weight_version = 0
        self._updates: dict[str, Any] = {}  # checkpoint name -> tensor, every update so far
        self._kv_layout: tuple[tuple[int, ...], Any, int] | None = None  # shape, dtype, layers
        self._profile: _ProfileSession | None = None
        self._bounded: dict[str, Any] | None = None  # what a session stopped at a bound wrote

    # ------------------------------------------------------------------ sleep

    def sleep(self, level: int) -> ControlResult:
        engine = self._engine
        if level not in (0, 1, 2):
            return _invalid(f"sleep level must be 0, 1 or 2, got {level}")
        if level >= 1 and engine.has_unfinished():
            return _conflict("requests still hold the KV cache; abort or drain them first")
        before = resident_bytes()
        runner = engine.runner
        if level >= 1 and "kv_cache" not in self.asleep:
            k0 = runner.k_caches[0]
            self._kv_layout = (tuple(k0.shape), k0.dtype, len(runner.k_caches))
            runner.k_caches, runner.v_caches = [], []
            engine.kv.reset_cache()  # the cached prefixes' KV is gone
            self.asleep.add("kv_cache")
        if level == 2 and "weights" not in self.asleep:
            runner.model = None
            engine.loaded = dataclasses.replace(engine.loaded, model=None)
            self._updates.clear()  # level 2 gives the weights up: wake reads the disk
            self.asleep.add("weights")
        _trim_heap()
        after = resident_bytes()
        log.info("sleep level %d: RSS %.1f -> %.1f MiB", level, before / 2**20, after / 2**20)
        return ControlResult(True, {"level": level, "rss_before": before, "rss_after": after})

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
            import torch

            assert self._kv_layout is not None
            shape, dtype, layers = self._kv_layout
            runner = self._engine.runner
            runner.k_caches = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
            runner.v_caches = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
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
        expected = _checkpoint_shapes(self._engine.model_dir)
        dtype = self._engine.dtype
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
        self._engine.kv.reset_cache()  # KV computed with the old weights is stale
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

        engine = self._engine
        quant = engine.config.quantization
        cfg = ModelConfig.from_dir(engine.model_dir)
        load_dtype = torch.float32 if quant == "int8" else engine.dtype
        model = build_model(cfg, dtype=load_dtype)
        files = safetensors_files(engine.model_dir)
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

            hf_cfg = json.loads((engine.model_dir / "config.json").read_text())
            kept = quantized_weights(engine.loaded.source, hf_cfg)
            model.pack_weights({k: w for k, w in kept.items()
                                if not changed.intersection(matrix_parts(k))})
        elif quant == "int8":
            from actors.loader.int8 import int8_weights

            model.pack_weights(int8_weights(model))
        else:
            model.pack_weights()
        return model

    def _swap_model(self, model: Any) -> None:
        engine = self._engine
        engine.runner.model = model
        engine.loaded = dataclasses.replace(engine.loaded, model=model)
        if engine.linear_routing is not None:  # the same shapes: keep their routes
            engine.linear_routing = model.route_linears(table=engine.linear_routing)
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
        self._profile = _ProfileSession(config, prefix, max_iterations)
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


class _CoreTimers:
    """Wraps the core's native entry points (as scripts/profile_step.py does) so each call
    is a named span in the trace and adds to a per-name total; restore() undoes it."""

    def __init__(self) -> None:
        import llmcore
        from torch.profiler import record_function

        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._undo: list[tuple[Any, str, Any]] = []
        c = llmcore._C
        for owner, attr in ((c, "linear"), (c, "rms_norm"), (c, "rope"), (c, "silu_mul"),
                            (llmcore, "kv_store"), (llmcore, "paged_attention"),
                            (llmcore, "AttentionPlan"), (llmcore, "sample")):
            fn = getattr(owner, attr, None)
            if fn is not None:
                self._undo.append((owner, attr, fn))
                setattr(owner, attr, self._timed(fn, f"llmcore.{attr}", record_function))

    def _timed(self, fn: Callable[..., Any], name: str, span: Any) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            with span(name):
                out = fn(*args, **kwargs)
            self.total[name] += time.perf_counter() - t
            self.calls[name] += 1
            return out
        return timed

    def restore(self) -> dict[str, dict[str, float]]:
        for owner, attr, fn in reversed(self._undo):
            setattr(owner, attr, fn)
        return {name: {"calls": self.calls[name], "total_ms": round(1e3 * total, 3),
                       "mean_us": round(1e6 * total / self.calls[name], 2)}
                for name, total in sorted(self.total.items(), key=lambda kv: -kv[1])}


class _ProfileSession:
    def __init__(self, config: Mapping[str, Any], prefix: str | None,
                 max_iterations: int | None = None) -> None:
        import torch
        from torch._C._profiler import _ExperimentalConfig
        from torch.profiler import ProfilerActivity, profile

        self.directory = Path(config["torch_profiler_dir"])
        self.directory.mkdir(parents=True, exist_ok=True)
        self.gzip = bool(config.get("torch_profiler_use_gzip", True))
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.name = f"{prefix + '_' if prefix else ''}engine_{os.getpid()}_{stamp}"
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.profiler = profile(
            activities=activities,
            record_shapes=bool(config.get("torch_profiler_record_shapes", False)),
            with_stack=bool(config.get("torch_profiler_with_stack", True)),
            profile_memory=bool(config.get("torch_profiler_with_memory", False)),
            with_flops=bool(config.get("torch_profiler_with_flops", False)),
            # Steps run in worker threads, not the thread that starts the profiler.
            experimental_config=_ExperimentalConfig(profile_all_threads=True),
        )
        self.max_steps = int(max_iterations or config.get("max_iterations")
                             or PROFILE_MAX_ITERATIONS)
        self.max_bytes = int(config.get("max_profile_bytes") or PROFILE_MAX_BYTES)
        self.steps = 0
        self.bound_hit = ""
        self.timers = _CoreTimers()
        self.started = time.perf_counter()
        self.rss_at_start = resident_bytes()
        self.profiler.start()

    def at_bound(self) -> bool:
        self.steps += 1
        if self.steps >= self.max_steps:
            self.bound_hit = f"{self.steps} steps"
        elif self.steps % 16 == 0 and resident_bytes() - self.rss_at_start > self.max_bytes:
            self.bound_hit = f"{self.max_bytes} bytes of memory"
        return bool(self.bound_hit)

    def stop(self) -> dict[str, Any]:
        self.profiler.stop()
        timers = self.timers.restore()
        trace = self.directory / f"{self.name}.pt.trace.json{'.gz' if self.gzip else ''}"
        self.profiler.export_chrome_trace(str(trace))
        summary = self.directory / f"{self.name}_core_timers.json"
        summary.write_text(json.dumps({
            "seconds": round(time.perf_counter() - self.started, 3), "calls": timers,
        }, indent=1))
        return {"trace": str(trace), "core_timers": str(summary)}
