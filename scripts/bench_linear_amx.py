"""Benchmark the packed bf16 linear on the AMX tiles against the AVX512_BF16 kernel and torch.

For the default model's projection shapes (SmolLM2-135M; N x K: o_proj 576x576, k/v 192x576,
gate/up 1536x576, down 576x1536, lm_head 49152x576) at M rows in --m (default 1, 2, 4, 8, 16,
64, 256, 1024), in one process and one run: the median time of llmcore.linear on a packed bf16
weight with the tile kernel (linear ISA "amx"), with the AVX512_BF16 kernel
(``llmcore.isa.capped("avx512")``), and torch.mm on bf16 tensors (bf16 x and W^T; ours takes
fp32 x and writes fp32, rounding x to bf16 inside the call). Each measurement cycles through
enough copies of the weight to overflow the last-level cache, as a model streams its layers
once per token. Reports TFLOPS, amx/avx512 and amx/torch speed ratios, the CPU model, its
amx/avx512 flags and the thread count.

Prints progress on stderr and one JSON object on stdout (also written to --out).

    PYTHONPATH=python python scripts/bench_linear_amx.py --out docs/bench/linear-amx-cpu-amx.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llmcore
import torch

SHAPES = [("o_proj", 576, 576), ("kv", 192, 576), ("gate_up", 1536, 576), ("down", 576, 1536),
          ("lm_head", 49152, 576)]
CACHE_BYTES = 96 << 20  # more than the last-level cache of the machines we run on


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cpu_info() -> dict[str, Any]:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    return {"model": fields.get("Model name", "?").strip(),
            "flags": sorted(f for f in flags if f.startswith(("amx", "avx512"))),
            "cpu_isa": llmcore.cpu_isa()}


def timed(fns: list[Callable[[], Any]], repeats: int, budget_s: float) -> float:
    """Median seconds per call, cycling through fns (one per weight copy)."""
    fns[0]()
    times: list[float] = []
    start = time.perf_counter()
    i = 0
    while len(times) < repeats and (len(times) < 3 or time.perf_counter() - start < budget_s):
        t = time.perf_counter()
        fns[i % len(fns)]()
        times.append(time.perf_counter() - t)
        i += 1
    return statistics.median(times)


def bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, n, k in SHAPES:
        if args.shapes and name not in args.shapes:
            continue
        w = (torch.randn(n, k, generator=gen) * 0.05).bfloat16()
        copies = max(1, min(32, -(-CACHE_BYTES // (n * k * 2))))
        ws = [w.clone() for _ in range(copies)]
        packed = [llmcore.PackedWeight(c) for c in ws]
        for m in args.m:
            x = torch.randn(m, k, generator=gen)
            xb, out = x.bfloat16(), torch.empty(m, n)
            ours = [lambda p=p: llmcore.linear(x, p, None, out) for p in packed]
            times: dict[str, float] = {}
            for isa in ("amx", "avx512"):
                with llmcore.isa.capped(isa, ("linear",)) as got:
                    if got["linear"] == isa:
                        times[isa] = timed(ours, args.repeats, args.budget_s)
            times["torch_bf16"] = timed([lambda c=c: torch.mm(xb, c.t()) for c in ws],
                                        args.repeats, args.budget_s)
            flop = 2 * m * n * k
            row: dict[str, Any] = {"shape": name, "N": n, "K": k, "M": m}
            for key, t in times.items():
                row[f"{key}_ms"] = round(t * 1e3, 4)
                row[f"{key}_TFLOPS"] = round(flop / t / 1e12, 3)
            if "amx" in times:
                row["amx_vs_avx512"] = (round(times["avx512"] / times["amx"], 2)
                                        if "avx512" in times else None)
                row["amx_vs_torch_bf16"] = round(times["torch_bf16"] / times["amx"], 2)
            log(f"{name:8s} M={m:5d}: " + ", ".join(
                f"{key} {t * 1e3:.4f} ms ({flop / t / 1e12:.3f} TFLOPS)" for key, t in times.items())
                + (f" -> amx x{row.get('amx_vs_avx512')} vs avx512, "
                   f"x{row.get('amx_vs_torch_bf16')} vs torch" if "amx" in times else ""))
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64, 256, 1024])
    ap.add_argument("--shapes", nargs="+", choices=[s[0] for s in SHAPES])
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the core's pool is "
                    "sized by LLMCORE_THREADS / the CPU count)")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--budget-s", type=float, default=2.0, help="per measurement, after 3 calls")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    info = cpu_info()
    if info["cpu_isa"] != "amx":
        log(f"this CPU runs {info['cpu_isa']} at most: the tile kernel is not measured")
    rows = bench(args)
    doc = {"cpu": info, "torch_threads": torch.get_num_threads(),
           "core_threads": llmcore.get_num_threads(),
           "torch": torch.__version__, "rows": rows}
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
