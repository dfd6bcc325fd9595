"""Benchmark llmcore.moe_experts (the grouped MoE expert product) against a Python loop over
the used experts that calls llmcore._C.linear / silu_mul per expert (what a model block would
do without the grouped op: gather the expert's rows with torch, two linears, the activation,
a weighted index_add).

Shapes: Qwen3-30B-A3B's experts scaled down to fit a shared machine's memory: E experts
(default 64, the model has 128) of hidden H = 1024 (the model: 2048), intermediate I = 768 (as
the model), top-k 8, at T tokens in {1, 8, 64, 256}. Calls cycle through copies of the layer
(--cache-bytes, 1 GiB in all by default: one bf16 layer is 302 MB, the machine's L3 480 MiB),
so every call streams its used experts from memory as a model's layers do. Router: softmax
over random logits, top-k, renormalised.
Formats: bfloat16, q8_0 and q4_0 (GGUF blocks quantized with gguf-py), float32 with --fp32.

Per (format, T): the median ms of each way, their ratio (loop / grouped), the experts used,
and the grouped op's expert-weight bytes read per second and GFLOP/s. Both ways' outputs are
compared (they run the same kernels on the same rows, so they agree to fp32 rounding). Runs
alternate between the two ways so that a burst of load on the shared machine falls on both.

Prints one JSON object on stdout; progress on stderr.

    PYTHONPATH=python python scripts/bench_moe.py > docs/bench/moe-cpu-avx512.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import llmcore
import torch

GGML = {"q8_0": 8, "q4_0": 2}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def packer(fmt: str, w: torch.Tensor) -> Callable[[], llmcore.PackedWeight]:
    """A function that packs w in fmt (GGUF formats: quantized once, each call repacks)."""
    if fmt in ("float32", "bfloat16"):
        src = w if fmt == "float32" else w.bfloat16()
        return lambda: llmcore.PackedWeight(src)
    import gguf

    blocks = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType(GGML[fmt]))
    return lambda: llmcore.PackedWeight.from_gguf(GGML[fmt], blocks, *w.shape)


def make_layers(fmt: str, e: int, h: int, i: int,
                min_bytes: int) -> list[tuple[list[Any], list[Any]]]:
    """Copies of one layer's E gate/up [2I, H] and down [H, I] matrices in fmt, enough that
    they overflow the last-level cache (min_bytes together), each (gate_up list, down list)."""
    g = torch.Generator().manual_seed(1)
    first = [packer(fmt, torch.randn(2 * i, h, generator=g) / h**0.5)]
    first.append(packer(fmt, torch.randn(h, i, generator=g) / i**0.5))
    layer_bytes = e * (first[0]().nbytes + first[1]().nbytes)
    copies = max(1, -(-min_bytes // layer_bytes))
    layers: list[tuple[list[Any], list[Any]]] = [([], []) for _ in range(copies)]
    for x in range(e):
        pack_gu, pack_dn = first if x == 0 else (
            packer(fmt, torch.randn(2 * i, h, generator=g) / h**0.5),
            packer(fmt, torch.randn(h, i, generator=g) / i**0.5))
        for gate_up, down in layers:
            gate_up.append(pack_gu())
            down.append(pack_dn())
    return layers


def routing(t: int, k: int, e: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w, ids = torch.softmax(torch.randn(t, e, generator=g), -1).topk(k, -1)
    return ids, (w / w.sum(-1, keepdim=True)).float()


class Loop:
    """The per-expert Python loop over llmcore's single-matrix kernels."""

    def __init__(self, gate_up: list[Any], down: list[Any], h: int, i: int) -> None:
        self.gate_up, self.down, self.h, self.i = gate_up, down, h, i

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor,
                 out: torch.Tensor) -> None:
        k = ids.shape[1]
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=len(self.gate_up)).tolist()
        tokens = order // k
        weights = w.flatten()[order]
        out.zero_()
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            rows = tokens[start : start + n]
            h = torch.empty(n, 2 * self.i)
            llmcore._C.linear(x[rows], self.gate_up[e], None, h)
            a = torch.empty(n, self.i)
            llmcore._C.silu_mul(h, a)
            y = torch.empty(n, self.h)
            llmcore._C.linear(a, self.down[e], None, y)
            out.index_add_(0, rows, y * weights[start : start + n, None])
            start += n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--formats", nargs="+", default=["bfloat16", "q8_0", "q4_0"])
    ap.add_argument("--fp32", action="store_true", help="also float32 experts (2x bf16's memory)")
    ap.add_argument("--repeats", type=int, default=15, help="runs of each way per (format, T)")
    ap.add_argument("--threads", type=int, default=0, help="llmcore threads (0: all)")
    ap.add_argument("--cache-bytes", type=int, default=1 << 30,
                    help="copies of the layer to cycle through, at least this many bytes in all")
    args = ap.parse_args()
    if args.threads:
        llmcore.set_num_threads(args.threads)
    torch.set_num_threads(1)  # the loop's torch ops are small; no second pool to contend with
    e, h, i, k = args.experts, args.hidden, args.intermediate, args.top_k
    formats = args.formats + (["float32"] if args.fp32 else [])
    results = []
    for fmt in formats:
        log(f"packing {e} experts as {fmt}")
        layers = make_layers(fmt, e, h, i, args.cache_bytes)
        experts = [llmcore.PackedExperts(gu, dn) for gu, dn in layers]
        loops = [Loop(gu, dn, h, i) for gu, dn in layers]
        per_expert = experts[0].nbytes / e
        log(f"{len(layers)} copies of the layer, {len(layers) * experts[0].nbytes / 2**20:.0f} MiB")
        for t in args.tokens:
            ids, w = routing(t, k, e, seed=t)
            x = torch.randn(t, h, generator=torch.Generator().manual_seed(t))
            out_g, out_l = torch.empty(t, h), torch.empty(t, h)
            llmcore.moe_experts(x, ids, w, experts[0], out=out_g)
            loops[0](x, ids, w, out_l)
            diff = (out_g - out_l).abs().max().item() / max(out_l.abs().max().item(), 1e-30)
            grouped, looped = [], []
            for r in range(args.repeats):
                layer = r % len(layers)
                for way in ((0, 1) if r % 2 == 0 else (1, 0)):
                    s = time.perf_counter()
                    if way == 0:
                        llmcore.moe_experts(x, ids, w, experts[layer], out=out_g)
                    else:
                        loops[layer](x, ids, w, out_l)
                    (grouped if way == 0 else looped).append(time.perf_counter() - s)
            used = int(torch.unique(ids).numel())
            g_ms, l_ms = statistics.median(grouped) * 1e3, statistics.median(looped) * 1e3
            row = {
                "format": fmt,
                "tokens": t,
                "experts_used": used,
                "grouped_ms": round(g_ms, 4),
                "loop_ms": round(l_ms, 4),
                "loop_over_grouped": round(l_ms / g_ms, 2),
                "grouped_weight_GBps": round(used * per_expert / (g_ms / 1e3) / 1e9, 2),
                "grouped_GFLOPs": round(2 * t * k * 3 * h * i / (g_ms / 1e3) / 1e9, 1),
                "max_rel_diff": float(f"{diff:.3g}"),
            }
            log(json.dumps(row))
            results.append(row)
        del layers, experts, loops
    print(json.dumps({
        "bench": "moe_experts (grouped) vs a Python loop over experts calling llmcore._C.linear",
        "machine": {"cpu_isa": llmcore.cpu_isa(), "linear_isa": llmcore.linear_isa(),
                    "threads": llmcore.get_num_threads(), "processor": platform.processor()},
        "shape": {"experts": e, "hidden": h, "intermediate": i, "top_k": k,
                  "note": "Qwen3-30B-A3B experts (E=128, H=2048, I=768, k=8) with E and H halved"},
        "repeats": args.repeats,
        "layer_copies_bytes_min": args.cache_bytes,
        "load_average": list(os.getloadavg()),
        "results": results,
    }, indent=1))


if __name__ == "__main__":
    main()
