"""The machine a benchmark ran on, and its memory bandwidth.

``cpu_info``: lscpu's model name and caches, the AVX-512 / AMX flags. ``Bandwidth``: copy
(STREAM's convention: the bytes read plus the bytes written) and read-only (the maximum of
the buffer: numpy's SIMD reduction, ~100 GB/s from L2 on one core, so memory bound)
bandwidth of one buffer, split over a number of Python threads, each its own slice
(np.copyto and np.max release the GIL), as the core's thread pool splits a product. Not a
BLAS dot: OpenBLAS threads a long one itself, which would oversubscribe the cores. The
buffers are advised into huge pages, as the core keeps its packed weights, so TLB misses
do not count against the memory. Each figure is the best of a few passes: the fastest the
machine streamed in that sample.
"""

from __future__ import annotations

import mmap
import os
import platform
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np


def cpu_info(threads: int) -> dict[str, Any]:
    """lscpu's model name, caches and the AVX-512 / AMX flags (from /proc/cpuinfo)."""
    info: dict[str, Any] = {"threads": threads, "logical_cpus": os.cpu_count(),
                            "machine": platform.machine()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        out = ""
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    for key, name in (("Model name", "model_name"), ("L2 cache", "l2_cache"),
                      ("L3 cache", "l3_cache")):
        if key in fields:
            info[name] = fields[key].strip()
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "flags" and not flags:
                    flags = set(val.split())
                elif key in ("cpu family", "model", "stepping") and key not in info:
                    info[key.replace(" ", "_")] = int(val)
    except OSError:
        pass
    info["isa_flags"] = sorted(f for f in flags if re.match(r"(avx512|amx)", f))
    return info


def huge_buffer(nbytes: int) -> tuple[mmap.mmap, np.ndarray]:
    """A float32 buffer in anonymous memory advised into huge pages, every page written."""
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    a = np.frombuffer(m, dtype=np.float32)
    a.fill(1.0)
    return m, a


class Bandwidth:
    """Copy and read bandwidth of one buffer size, split over ``threads`` Python threads
    (np.copyto and np.max release the GIL), each pass timed end to end."""

    def __init__(self, nbytes: int, threads: int, copy: bool = True) -> None:
        self.nbytes = nbytes
        self.pool = ThreadPoolExecutor(threads)
        self.threads = threads
        self._src = huge_buffer(nbytes)
        self._dst = huge_buffer(nbytes) if copy else None
        self.src = np.array_split(self._src[1], threads)
        self.dst = np.array_split(self._dst[1], threads) if self._dst else None

    def _pass(self, fn: Any) -> float:
        t = time.perf_counter()
        list(self.pool.map(fn, range(self.threads)))
        return time.perf_counter() - t

    def copy_gb_s(self, passes: int) -> float:
        """Bytes read + written per second (STREAM's copy), best of ``passes``."""
        assert self.dst is not None
        dst, src = self.dst, self.src
        return 2 * self.nbytes / min(self._pass(lambda i: np.copyto(dst[i], src[i]))
                                     for _ in range(passes)) / 1e9

    def read_gb_s(self, passes: int) -> float:
        """Bytes read per second by the buffer's maximum."""
        src = self.src
        return self.nbytes / min(self._pass(lambda i: np.max(src[i]))
                                 for _ in range(passes)) / 1e9

    def close(self) -> None:
        """Stops the threads; the buffers go with the last reference to them."""
        self.pool.shutdown()
        self.src = self.dst = self._src = self._dst = None  # type: ignore[assignment]
