"""Per-shape kernel routing, chosen at load: the core's packed kernel or torch's F.linear,
whichever this machine runs faster for a (matrix shape, M bucket).

Neither wins everywhere: the core's packed kernels read bf16 weights at half the bytes and
win at M = 1 (memory bound), while torch's BLAS (oneDNN; with AVX512_BF16 in bf16) can win
the compute-bound large M of prefill and big decode batches. Rather than hand-tuned
thresholds, ``measure`` times both on the model's own shapes at M in ``BUCKETS`` (medians of
a few alternated calls, so the cost of handing the cores from one thread pool to the other
is in both figures, as it is in a routed step) within a time budget, and the forward pass
routes each product by the bucket of its row count. A quantized matrix (any GGUF type the
core keeps) races its quantized kernel against the core's bf16 kernel on a bf16 copy of it
(dequantized once at load, "core_bf16"): the quantized kernel reads 4.5-8.5 bits a weight
and wins the memory-bound small M; the bf16 kernel (AVX512_BF16's dot products where the
CPU has them) wins prefill and big batches, and there the product is exactly the bf16
path's (the same bf16 matrix the unquantized load makes). The copy costs 2 bytes a weight
beside the quantized one, for the shapes it wins somewhere. M = 1 is not raced for a
quantized matrix: a single-sequence decode step streams every matrix once, the copy reads
2-3.5x the bytes, and the race (one matrix, hot in cache, on a machine that may be busy)
cannot see that; timed under load it sent small shapes to torch, and a step that hands the
cores between torch's threads and the core's dozens of times ran 2-4x slower
(scripts/bench_decode_bw.py). Every entry the budget did not
reach stays on the core's own kernel, and so does a bf16 matrix on a CPU without native
bf16 arithmetic (AVX512_BF16, AMX): there torch would round the fp32 activations to bf16,
a loss the core's widening kernel does not have, and its speed swings with the machine's
load (measured here from 0.2 to 15 ms for one 576x576 product at M = 1), so the route, and
with it the results, would change from one start to the next.

Routing changes only the kernel, never the weights or the activations' dtype outside it:
torch runs in the weight's dtype (a bf16 matrix multiplies x rounded to bf16, as torch's
bf16 path does), so a routed output differs from the core's by those kernels' rounding.
"""

from __future__ import annotations

import bisect
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import llmcore
import numpy as np
import torch
import torch.nn.functional as F

log = logging.getLogger("actors.models.linear_routing")

BUCKETS = (1, 8, 64, 256)
# Row counts up to each bound fall in the bucket of the same index (geometric midpoints).
_BOUNDS = (2, 22, 127)
REPEATS = 3
# torch must be this much faster to take a shape: a tie stays on the core, which needs no
# second copy of the matrix, and a noisy machine should not flip routes on a few percent.
MARGIN = 0.8
DEFAULT_BUDGET_S = 1.5
QUANT_BUDGET_S = 3.0  # the default when quantized matrices race too (more shapes' entries)
QUANTIZED = tuple(llmcore.GGUF_KEPT_TYPES.values())
CLEAR = 3.0  # a first timing this lopsided decides without the other repeats

LinearFn = Callable[[torch.Tensor, Any, torch.Tensor | None, torch.Tensor], torch.Tensor]


def bucket(m: int) -> int:
    """Index in BUCKETS of the bucket a product of ``m`` rows falls in."""
    return bisect.bisect_left(_BOUNDS, m)


def torch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 out: torch.Tensor) -> torch.Tensor:
    """``out = x @ weight.T (+ bias)`` by torch in the weight's dtype; the core's signature."""
    if weight.dtype == x.dtype:
        if bias is None:
            return torch.mm(x, weight.t(), out=out)
        return torch.addmm(bias, x, weight.t(), out=out)
    b = None if bias is None else bias.to(weight.dtype)
    return out.copy_(F.linear(x.to(weight.dtype), weight, b))


@dataclass(frozen=True, slots=True)
class Route:
    """One (matrix shape, M bucket): the kernel chosen and the medians it was chosen on."""

    n: int
    k: int
    weight_format: str  # PackedWeight.dtype: float32 | bfloat16 | a kept GGUF type (q4_k...)
    m: int  # the bucket's row count
    # "core" | "torch" (a float matrix, or a quantized one's dense bf16 copy) | "core_bf16" (a
    # quantized matrix's bf16 copy packed for the core)
    kernel: str
    core_us: float | None  # None: not measured (quantized, or past the budget)
    torch_us: float | None


@dataclass(frozen=True, slots=True)
class RoutingTable:
    routes: tuple[Route, ...]
    budget_s: float
    elapsed_s: float
    threads: int

    def kernel(self, n: int, k: int, weight_format: str, m_bucket: int) -> str:
        for r in self.routes:
            if (r.n, r.k, r.weight_format, r.m) == (n, k, weight_format, BUCKETS[m_bucket]):
                return r.kernel
        return "core"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: what /server_info shows."""
        return {"buckets": list(BUCKETS), "budget_s": self.budget_s,
                "elapsed_s": round(self.elapsed_s, 3), "threads": self.threads,
                "margin": MARGIN, "routes": [asdict(r) for r in self.routes]}

    def summary(self) -> str:
        """The table as log lines: one per shape, a column per bucket."""
        lines = [f"linear routing ({self.elapsed_s:.2f} s of {self.budget_s} s, "
                 f"{self.threads} threads), us core/torch per M {list(BUCKETS)}:"]
        by_shape: dict[tuple[int, int, str], list[Route]] = {}
        for r in self.routes:
            by_shape.setdefault((r.n, r.k, r.weight_format), []).append(r)
        for (n, k, fmt), rs in by_shape.items():
            cells = []
            for r in rs:
                if r.core_us is None or r.torch_us is None:
                    cells.append(f"M={r.m} {r.kernel} (unmeasured)")
                else:
                    cells.append(f"M={r.m} {r.kernel} ({r.core_us:.0f}/{r.torch_us:.0f})")
            lines.append(f"  [{n}x{k}] {fmt}: " + ", ".join(cells))
        return "\n".join(lines)


def unpacked(packed: llmcore.PackedWeight) -> torch.Tensor:
    """The matrix for torch: a float one in its dtype, a quantized one dequantized to bf16."""
    n, k = packed.shape
    ids = np.arange(n, dtype=np.int64)
    if packed.dtype in QUANTIZED:
        return packed.rows(ids, torch.empty((n, k), dtype=torch.bfloat16))
    rows = packed.rows(ids, torch.empty((n, k), dtype=torch.float32))
    return rows.to(getattr(torch, packed.dtype))  # bf16 values widened and back: exact


def alternative(packed: llmcore.PackedWeight,
                kernel: str | None = None) -> torch.Tensor | llmcore.PackedWeight:
    """What a route away from ``packed``'s own kernel multiplies with: the float matrix for
    torch, or a quantized matrix's bf16 copy, packed for the core (``kernel`` "core_bf16",
    the default) or dense for torch's bf16 GEMM ("torch")."""
    dense = unpacked(packed)
    if packed.dtype in QUANTIZED and kernel != "torch":
        return llmcore.PackedWeight(dense)
    return dense


def apply(kernel: str, x: torch.Tensor, other: torch.Tensor | llmcore.PackedWeight,
          bias: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    """One product on a routed entry's alternative (``alternative``'s result)."""
    if kernel == "core_bf16":
        return llmcore._C.linear(x, other, bias, out)
    return torch_linear(x, other, bias, out)


def _time(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(matrices: list[llmcore.PackedWeight], budget_s: float | None = None,
            force: str | None = None, fast_bf16: bool | None = None) -> RoutingTable:
    """Times the core against torch for each distinct (shape, format) among ``matrices`` at
    every bucket (a quantized one's M = 1 stays on its own kernel, untimed: see the module
    doc), cheapest products first, until ``budget_s`` is spent (default
    DEFAULT_BUDGET_S, QUANT_BUDGET_S when quantized matrices race); a product whose
    predicted cost (from the same shape's smaller bucket) would overrun it is skipped.

    force: "core" routes every entry to its own core kernel, "torch" every entry to the
    other one (torch for a float matrix, core_bf16 for a quantized one), untimed (tests).
    fast_bf16: whether bf16 matrices race torch (default: the CPU has native bf16
    arithmetic); quantized matrices race a bf16 copy on every CPU: the core's bf16 kernel on
    it ("core_bf16"), or where bf16 is native, whichever of that and torch's bf16 GEMM
    ("torch") is faster on the shape's largest bucket (one copy per shape, not both)."""
    from actors.loader.dtype import cpu_has_fast_bf16

    if fast_bf16 is None:
        fast_bf16 = cpu_has_fast_bf16()
    racing = ("float32", "bfloat16", *QUANTIZED) if fast_bf16 else ("float32", *QUANTIZED)
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    shapes: dict[tuple[int, int, str], llmcore.PackedWeight] = {}
    for w in matrices:
        shapes.setdefault((*w.shape, w.dtype), w)
    if budget_s is None:
        budget_s = (QUANT_BUDGET_S if any(f in QUANTIZED and f in racing for _, _, f in shapes)
                    else DEFAULT_BUDGET_S)
    entries = sorted(((n * k * m, n, k, fmt, m) for (n, k, fmt) in shapes for m in BUCKETS))
    routes: dict[tuple[int, int, str, int], Route] = {}
    dense: dict[tuple[int, int, str], torch.Tensor] = {}
    last: dict[tuple[int, int, str], tuple[int, float, float]] = {}  # m, core s, torch s
    copy_kernel: dict[tuple[int, int, str], str] = {}  # a quantized shape's copy: its kernel
    for _, n, k, fmt, m in entries:
        key = (n, k, fmt)
        route = Route(n, k, fmt, m, "core", None, None)
        if force is not None:
            other = "core_bf16" if fmt in QUANTIZED else "torch"
            route = Route(n, k, fmt, m, other if force == "torch" else "core", None, None)
        elif fmt in racing and not (fmt in QUANTIZED and m == BUCKETS[0]):
            prev = last.get(key)
            left = budget_s - (time.perf_counter() - t0)
            # Both kernels, warm-up included; cost grows about linearly in M here.
            predicted = (0.0 if prev is None
                         else (prev[1] + prev[2]) * (m / prev[0]) * (REPEATS + 1))
            if left > 0 and predicted < left:
                if key not in dense:
                    if fmt in QUANTIZED and fast_bf16:
                        copy_kernel[key], dense[key] = _copy_kernel(shapes[key], gen, left / 4)
                    else:
                        copy_kernel[key] = "core_bf16" if fmt in QUANTIZED else "torch"
                        dense[key] = alternative(shapes[key], copy_kernel[key])
                route = _race(shapes[key], dense[key], m, gen, copy_kernel[key])
                last[key] = (m, route.core_us / 1e6, route.torch_us / 1e6)
        routes[(n, k, fmt, m)] = route
    ordered = tuple(routes[(n, k, fmt, m)] for (n, k, fmt) in shapes for m in BUCKETS)
    return RoutingTable(ordered, budget_s, time.perf_counter() - t0, torch.get_num_threads())


def _copy_kernel(packed: llmcore.PackedWeight, gen: torch.Generator,
                 budget_s: float) -> tuple[str, torch.Tensor | llmcore.PackedWeight]:
    """A quantized matrix's bf16 copy and its kernel: dense for torch ("torch") where torch's
    bf16 GEMM beats the core's bf16 kernel at the largest bucket by the margin (AMX, say),
    else packed for the core ("core_bf16"), also when the race would not fit ``budget_s``.
    The copy raced is the one returned (dequantized once)."""
    n, k = packed.shape
    dense = unpacked(packed)
    core = llmcore.PackedWeight(dense)
    x = torch.randn((BUCKETS[-1], k), generator=gen)
    out = torch.empty((BUCKETS[-1], n))
    first = _time(lambda: llmcore._C.linear(x, core, None, out))  # also the warm-up
    if first * (2 * REPEATS + 2) > budget_s:
        return "core_bf16", core
    torch_linear(x, dense, None, out)  # warm-up
    ct, tt = [], []
    for _ in range(REPEATS):
        ct.append(_time(lambda: llmcore._C.linear(x, core, None, out)))
        tt.append(_time(lambda: torch_linear(x, dense, None, out)))
    if statistics.median(tt) < MARGIN * statistics.median(ct):
        return "torch", dense
    return "core_bf16", core


def _race(packed: llmcore.PackedWeight, dense: torch.Tensor | llmcore.PackedWeight, m: int,
          gen: torch.Generator, name: str) -> Route:
    n, k = packed.shape
    x = torch.randn((m, k), generator=gen)
    out = torch.empty((m, n))
    core = lambda: llmcore._C.linear(x, packed, None, out)  # noqa: E731
    other = lambda: apply(name, x, dense, None, out)  # noqa: E731
    core(), other()  # warm-up: first-touch pages, BLAS packing, caches
    ct, tt = [], []
    for i in range(REPEATS):  # alternated, so a burst of load falls on both
        ct.append(_time(core))
        tt.append(_time(other))
        if i == 0 and max(ct[0], tt[0]) > CLEAR * min(ct[0], tt[0]):
            break  # one kernel is several times the other: more calls would not change it
    c, t = statistics.median(ct), statistics.median(tt)
    kernel = name if t < MARGIN * c else "core"
    return Route(n, k, packed.dtype, m, kernel, round(c * 1e6, 1), round(t * 1e6, 1))
