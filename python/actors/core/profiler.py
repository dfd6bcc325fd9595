"""The profiler of ``/start_profile`` and ``/stop_profile`` (actors.core.operator).

torch's profiler records every thread (steps run in worker threads) while ``_CoreTimers``
wraps the core's native entry points with ``record_function`` spans and per-call timers;
stop writes the trace and ``<name>_core_timers.json`` into the configured directory. A
session stops itself at a bound (steps, or resident memory grown while recording).
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from actors.config import PROFILE_MAX_BYTES, PROFILE_MAX_ITERATIONS

__all__ = ["ProfileSession", "resident_bytes"]


def resident_bytes() -> int:
    """This process's resident set size (VmRSS), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


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


class ProfileSession:
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
