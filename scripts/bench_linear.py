"""Benchmark llmcore.linear (bf16 weights, fp32 activations; row-major and packed; GGUF
blocks of every type the core keeps, packed quantized) against torch's F.linear.

Kernels (default): the default model's projection shapes (SmolLM2-135M: fused qkv, o_proj,
fused gate_up, down_proj, tied lm_head) at M rows in {1, 8, 64, 256}; --shapes can add a
Llama-3.2-1B gate_up (1b_gate_up), where every K-quant applies (K a multiple of 256; a shape
whose K is not skips those types, as llama.cpp's quantizer does). Q8_0/Q4_0/Q4_1/Q5_0/Q5_1
blocks are quantized by gguf-py; the K-quants, which it cannot quantize, are random valid
blocks (the speed does not depend on the values). Each measurement cycles
through enough copies of the weight to overflow the last-level cache, as a model does when it
streams all its layers once per token, and reports the median time, the weight bytes read per
second and torch-fp32 time / ours. torch's own bf16 F.linear is timed too (slow on CPUs without
native bf16; skipped once a single call exceeds --bf16-limit-ms).

Engine (--engine): decode ms per step of the real model through the engine, batch 1 and 64,
for dtype float32, bfloat16, and bfloat16 with --quantization gguf and int8: every engine
loaded first, then --rounds rounds each running every mode in turn, the order reversed every
other round (so a burst of load on the shared machine falls on all of them), with each
round's ratios against bf16 and their medians. The q8_0 kernel rows are the kernel --quantization int8 runs.

Prints one JSON object on stdout; progress on stderr.

    PYTHONPATH=python python scripts/bench_linear.py --threads 1
    PYTHONPATH=python python scripts/bench_linear.py --engine --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import llmcore
import torch
import torch.nn.functional as F

# (name, N, K) for SmolLM2-135M: hidden 576, 9 q heads + 2 x 3 kv heads of 64, MLP 1536.
SHAPES = [
    ("qkv", 960, 576),
    ("o_proj", 576, 576),
    ("gate_up", 3072, 576),
    ("down", 576, 1536),
    ("lm_head", 49152, 576),
]
# Opt-in (--shapes): a Llama-3.2-1B MLP matrix, the size of a real Q4_K_M model's tensors.
EXTRA_SHAPES = [("1b_gate_up", 16384, 2048)]
CACHE_BYTES = 96 << 20  # more than the last-level cache of the machines we run on


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def timed(fns: list[Callable[[], Any]], repeats: int, budget_s: float) -> float:
    """Median seconds per call, cycling through fns (one per weight copy)."""
    fns[0]()
    times: list[float] = []
    start = time.perf_counter()
    i = 0
    while len(times) < repeats and (len(times) < 3 or time.perf_counter() - start < budget_s):
        fn = fns[i % len(fns)]
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        i += 1
    return statistics.median(times)


QUANT_TYPES = {name: num for num, name in llmcore.GGUF_KEPT_TYPES.items()}  # ggml numbers


def block_elems(name: str) -> int:
    import gguf

    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(QUANT_TYPES[name])][0]


def gguf_blocks(name: str, w: torch.Tensor) -> Any:
    """GGUF blocks for w: gguf-py's quantization where it has one, else random valid blocks
    (random quants and sub-scales, fp16 superblock scales around 1e-3)."""
    import gguf
    import numpy as np

    t = gguf.GGMLQuantizationType(QUANT_TYPES[name])
    try:
        return gguf.quants.quantize(w.numpy(), t)
    except NotImplementedError:
        elems, size = gguf.GGML_QUANT_SIZES[t]
        n, k = w.shape
        rng = np.random.default_rng(0)
        blocks = rng.integers(0, 256, (n * (k // elems), size), dtype=np.uint8)
        scale = np.full((len(blocks), 1), 1e-3, np.float16).view(np.uint8)
        for at in ((208,) if name == "q6_k" else (0, 2)):  # d (and dmin)
            blocks[:, at:at + 2] = scale
        return blocks.reshape(n, -1)


def quantized_copies(name: str, w: torch.Tensor, copies: int) -> list[llmcore.PackedWeight]:
    """GGUF blocks of w packed by the core; enough copies of the quantized bytes to overflow
    the last-level cache."""
    blocks = gguf_blocks(name, w)
    n, k = w.shape
    one = llmcore.PackedWeight.from_gguf(QUANT_TYPES[name], blocks, n, k)
    copies = max(1, min(64, -(-CACHE_BYTES // one.nbytes)))
    return [one] + [llmcore.PackedWeight.from_gguf(QUANT_TYPES[name], blocks, n, k)
                    for _ in range(copies - 1)]


def bench_kernels(args: argparse.Namespace) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, n, k in SHAPES + EXTRA_SHAPES:
        if name not in (args.shapes or [s[0] for s in SHAPES]):
            continue
        w32 = torch.randn(n, k, generator=gen) * 0.05
        copies = max(1, min(32, -(-CACHE_BYTES // (n * k * 4))))
        ws32 = [w32.clone() for _ in range(copies)]
        ws16 = [w.bfloat16() for w in ws32]
        packed16 = [llmcore.PackedWeight(w) for w in ws16]
        packed32 = [llmcore.PackedWeight(w) for w in ws32]
        quant = {q: quantized_copies(q, w32, copies) for q in args.quant
                 if k % block_elems(q) == 0}
        for m in args.m:
            x = torch.randn(m, k, generator=gen)
            out = torch.empty(m, n)
            ours = timed([lambda w=w, x=x, o=out: llmcore.linear(x, w, None, o) for w in ws16],
                         args.repeats, args.budget_s)
            ours32 = timed([lambda w=w, x=x, o=out: llmcore.linear(x, w, None, o) for w in ws32],
                           args.repeats, args.budget_s)
            ref32 = timed([lambda w=w, x=x: F.linear(x, w) for w in ws32], args.repeats, args.budget_s)
            pk16 = timed([lambda w=w, x=x, o=out: llmcore.linear(x, w, None, o) for w in packed16],
                         args.repeats, args.budget_s)
            pk32 = timed([lambda w=w, x=x, o=out: llmcore.linear(x, w, None, o) for w in packed32],
                         args.repeats, args.budget_s)
            # Where the packed bf16 kernel is wider than AVX2 (AVX512_BF16), the AVX2 one too.
            pk16_avx2: float | None = None
            if llmcore.linear_isa() != "avx2":
                with llmcore.isa.capped("avx2", ("linear",)):
                    pk16_avx2 = timed([lambda w=w, x=x, o=out: llmcore.linear(x, w, None, o)
                                       for w in packed16], args.repeats, args.budget_s)
            xb = x.bfloat16()
            t = time.perf_counter()
            F.linear(xb, ws16[0])
            ref16: float | None = None
            if (time.perf_counter() - t) * 1e3 < args.bf16_limit_ms:
                ref16 = timed([lambda w=w, xb=xb: F.linear(xb, w) for w in ws16], args.repeats,
                              args.budget_s)
            row = {
                "shape": name, "N": n, "K": k, "M": m,
                "ours_bf16_ms": round(ours * 1e3, 4),
                "ours_bf16_weight_GBps": round(n * k * 2 / ours / 1e9, 2),
                "ours_bf16_GFLOPs": round(2 * m * n * k / ours / 1e9, 1),
                "ours_fp32w_ms": round(ours32 * 1e3, 4),
                "packed_bf16_ms": round(pk16 * 1e3, 4),
                "packed_bf16_weight_GBps": round(n * k * 2 / pk16 / 1e9, 2),
                "packed_bf16_GFLOPs": round(2 * m * n * k / pk16 / 1e9, 1),
                "packed_fp32w_ms": round(pk32 * 1e3, 4),
                "speedup_packed_vs_torch_fp32": round(ref32 / pk16, 2),
                "torch_fp32_ms": round(ref32 * 1e3, 4),
                "torch_fp32_weight_GBps": round(n * k * 4 / ref32 / 1e9, 2),
                "torch_bf16_ms": None if ref16 is None else round(ref16 * 1e3, 3),
                "speedup_vs_torch_fp32": round(ref32 / ours, 2),
                "speedup_vs_torch_bf16": None if ref16 is None else round(ref16 / ours, 1),
                "speedup_packed_vs_torch_bf16": None if ref16 is None else round(ref16 / pk16, 2),
            }
            if pk16_avx2 is not None:
                row["packed_bf16_avx2_ms"] = round(pk16_avx2 * 1e3, 4)
                row["speedup_packed_vs_avx2"] = round(pk16_avx2 / pk16, 2)
            for qname, qpacked in quant.items():
                tq = timed([lambda w=w, x=x, o=out: llmcore.linear(x, w, None, o) for w in qpacked],
                           args.repeats, args.budget_s)
                row[f"packed_{qname}_ms"] = round(tq * 1e3, 4)
                row[f"packed_{qname}_weight_GBps"] = round(qpacked[0].nbytes / tq / 1e9, 2)
                row[f"packed_{qname}_GFLOPs"] = round(2 * m * n * k / tq / 1e9, 1)
                row[f"speedup_{qname}_vs_packed_bf16"] = round(pk16 / tq, 2)
                log(f"{name:8s} M={m:4d}: {qname} {tq * 1e3:.3f} ms "
                    f"({row[f'packed_{qname}_weight_GBps']} GB/s, "
                    f"{row[f'packed_{qname}_GFLOPs']} GFLOP/s) -> x{row[f'speedup_{qname}_vs_packed_bf16']}"
                    " vs packed bf16")
            log(f"{name:8s} M={m:4d}: ours {row['ours_bf16_ms']:.3f} ms "
                f"({row['ours_bf16_weight_GBps']} GB/s, {row['ours_bf16_GFLOPs']} GFLOP/s), "
                f"torch fp32 {row['torch_fp32_ms']:.3f} ms, torch bf16 {row['torch_bf16_ms']} ms"
                f" -> x{row['speedup_vs_torch_fp32']}; packed {row['packed_bf16_ms']:.3f} ms "
                f"({row['packed_bf16_GFLOPs']} GFLOP/s) -> x{row['speedup_packed_vs_torch_fp32']}")
            rows.append(row)
    return rows


ENGINE_MODES = (("float32", None), ("bfloat16", None), ("bfloat16", "gguf"),
                ("bfloat16", "int8"))


def _decode(eng: Any, tag: str, batch: int, new_tokens: int) -> dict[str, Any]:
    from actors import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    for i in range(batch):
        eng.add_request(f"{tag}-{batch}-{i}", [1 + (i * 7 + j) % 1000 for j in range(16)],
                        params)
    steps: list[tuple[float, int]] = []
    while eng.has_unfinished_requests():
        t = time.perf_counter()
        outs = eng.step().outputs
        steps.append((time.perf_counter() - t, sum(len(o.new_token_ids) for o in outs)))
    # Steps that produce one token per sequence are decode steps (the first also
    # finishes the prompts, so it is skipped).
    decode = [s for s, n in steps[1:] if n == batch]
    step_ms = statistics.median(decode) * 1e3
    return {"batch": batch, "decode_steps": len(decode), "step_ms": round(step_ms, 2),
            "ms_per_token": round(step_ms / batch, 3),
            "tok_s": round(batch * 1e3 / step_ms, 1)}


def bench_engine(args: argparse.Namespace) -> dict[str, Any]:
    from actors import LLM

    engines = {}
    for dtype, quantization in ENGINE_MODES:
        llm = LLM(dtype=dtype, quantization=quantization, num_threads=args.threads,
                  max_num_seqs=64, kv_cache_memory=256 << 20, max_model_len=2048,
                  linear_routing=args.linear_routing == "on",
                  batch_invariant=args.linear_routing == "off")
        engines[(dtype, quantization)] = llm.engine
    rounds: list[list[dict[str, Any]]] = []
    for r in range(args.rounds):
        rows = []
        order = list(engines.items())
        for (dtype, quantization), eng in order if r % 2 == 0 else order[::-1]:
            for batch in args.batch:
                row = {"dtype": dtype, "quantization": quantization,
                       **_decode(eng, f"{r}-{dtype}-{quantization}", batch, args.new_tokens)}
                log(f"round {r} engine {dtype:8s} {quantization or '-':4s} batch {batch:3d}: "
                    f"{row['step_ms']} ms/step, {row['tok_s']} tok/s")
                rows.append(row)
        rounds.append(rows)
    ratios: dict[str, dict[str, list[float]]] = {}
    for rows in rounds:
        base = {row["batch"]: row["tok_s"] for row in rows
                if row["dtype"] == "bfloat16" and row["quantization"] is None}
        for row in rows:
            mode = row["quantization"] or row["dtype"]
            ratios.setdefault(mode, {}).setdefault(str(row["batch"]), []).append(
                round(row["tok_s"] / base[row["batch"]], 3))
    medians = {mode: {b: statistics.median(v) for b, v in per.items()}
               for mode, per in ratios.items()}
    routing = {quantization or dtype: (None if eng.linear_routing is None
                                       else eng.linear_routing.as_dict())
               for (dtype, quantization), eng in engines.items()}
    return {"rounds": rounds, "tok_s_ratio_vs_bf16": ratios,
            "tok_s_ratio_vs_bf16_median": medians, "linear_routing": routing}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--m", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--shapes", nargs="*", default=None, help="subset of " +
                   ", ".join(s[0] for s in SHAPES + EXTRA_SHAPES) + " (default: all but " +
                   ", ".join(s[0] for s in EXTRA_SHAPES) + ")")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--budget-s", type=float, default=1.0, help="time cap per measurement")
    p.add_argument("--bf16-limit-ms", type=float, default=200.0)
    p.add_argument("--quant", nargs="*", default=list(QUANT_TYPES), choices=list(QUANT_TYPES),
                   help="GGUF block formats timed through the quantized packed kernel")
    p.add_argument("--engine", action="store_true", help="measure engine decode instead")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--rounds", type=int, default=3, help="engine rounds (all modes each)")
    p.add_argument("--linear-routing", choices=["on", "off"], default="off",
                   help="the engines' kernel routing. off: the core's kernels only, as the "
                   "server starts (batch-invariant); on: routed, as with --no-batch-invariant")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    llmcore.set_num_threads(args.threads)
    result: dict[str, Any] = {"threads": args.threads, "isa": llmcore.linear_isa()}
    if args.engine:
        result["engine"] = bench_engine(args)
    else:
        result["kernels"] = bench_kernels(args)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
