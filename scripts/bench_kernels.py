#!/usr/bin/env python
"""bench_kernels: time the core's CPU kernels and print ONE JSON document on stdout.

Attention: decode paged attention (SmolLM2 geometry: 9 query heads, 3 KV heads,
head size 64; block size 16 with shuffled block tables) against torch SDPA over
contiguous K/V of the same shapes, and the KV bytes it reads per second against
a memcpy bandwidth measured in the same run. Sampling: the dict returned by
scripts/bench_sampling.py's ``run(quick)``, when that script exists.

    PYTHONPATH=python python scripts/bench_kernels.py [--quick] > bench.json
    PYTHONPATH=python python scripts/bench_kernels.py --attention-engine-shapes > engine.json

Progress goes to stderr. ``--quick`` runs a few shapes with few repeats (CI smoke).
``--attention-engine-shapes`` times only the steps the engine runs on SmolLM2-135M
(see attention_engine_section) against torch SDPA on the same data.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import llmcore
import torch
import torch.nn.functional as F

NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 9, 3, 64, 16
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}



def geometry() -> dict[str, object]:
    """The attention geometry every case shares."""
    return {"num_heads": NUM_HEADS, "num_kv_heads": NUM_KV_HEADS, "head_size": HEAD_SIZE,
            "block_size": BLOCK_SIZE, "block_tables": "shuffled"}

def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class Memcpy:
    """A torch copy of a buffer larger than the caches: bytes copied per second.

    Each byte is read once and written once. Timed interleaved with each
    kernel, so both see the same load from whatever else runs on the machine.
    """

    def __init__(self, nbytes: int) -> None:
        self.src = torch.ones(nbytes, dtype=torch.uint8)
        self.dst = torch.empty_like(self.src)
        self.dst.copy_(self.src)

    def __call__(self) -> None:
        self.dst.copy_(self.src)

    @property
    def nbytes(self) -> int:
        return self.src.numel()


def median_pair(
    fn: Callable[[], object], other: Callable[[], object], repeats: int, warmup: int = 2
) -> tuple[float, float]:
    """Median seconds of fn and of other, timed alternately."""
    for _ in range(warmup):
        fn()
        other()
    a, b = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        other()
        t2 = time.perf_counter()
        a.append(t1 - t0)
        b.append(t2 - t1)
    return statistics.median(a), statistics.median(b)


def decode_case(batch: int, context: int, dtype_name: str, repeats: int, memcpy: Memcpy) -> dict:
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(batch * 100003 + context)
    blocks_per_seq = math.ceil(context / BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq
    block_tables = torch.randperm(num_blocks, generator=gen).to(torch.int32).view(batch, -1)
    shape = (num_blocks, NUM_KV_HEADS, BLOCK_SIZE, HEAD_SIZE)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    q = torch.randn(batch, NUM_HEADS, HEAD_SIZE, generator=gen).to(dtype)
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(HEAD_SIZE)
    plan = llmcore.AttentionPlan(
        torch.arange(batch + 1, dtype=torch.int32).numpy(),
        torch.full((batch,), context, dtype=torch.int32).numpy(),
        block_tables.numpy(),
        None,
        num_blocks=num_blocks,
    )
    # Every kernel is timed alternately with the large copy, which also
    # evicts the K/V from the caches: as in a model, where each layer's cache
    # is cold. Both sides of a comparison see the same conditions.
    ours, copy = median_pair(
        lambda: llmcore.paged_attention(plan, q, k_cache, v_cache, out, scale), memcpy, repeats
    )

    # The same K/V, contiguous: [batch, kv_heads, context, head_size].
    def dense(cache: torch.Tensor) -> torch.Tensor:
        rows = cache[block_tables.long()]  # [batch, blocks, kv_heads, block, head]
        rows = rows.permute(0, 2, 1, 3, 4).reshape(batch, NUM_KV_HEADS, -1, HEAD_SIZE)
        return rows[:, :, :context].contiguous()

    k, v = dense(k_cache), dense(v_cache)
    qd = q.view(batch, NUM_HEADS, 1, HEAD_SIZE)
    group = NUM_HEADS // NUM_KV_HEADS
    with torch.inference_mode():
        want = F.scaled_dot_product_attention(qd, k, v, scale=scale, enable_gqa=True)
        sdpa_gqa, copy_gqa = median_pair(
            lambda: F.scaled_dot_product_attention(qd, k, v, scale=scale, enable_gqa=True),
            memcpy,
            repeats,
        )
        del want
        k_rep = k.repeat_interleave(group, dim=1)
        v_rep = v.repeat_interleave(group, dim=1)
        want = F.scaled_dot_product_attention(qd, k_rep, v_rep, scale=scale)
        sdpa_rep, copy_rep = median_pair(
            lambda: F.scaled_dot_product_attention(qd, k_rep, v_rep, scale=scale), memcpy, repeats
        )
    memcpy_gbps = memcpy.nbytes / statistics.median([copy, copy_gqa, copy_rep]) / 1e9
    diff = (out.float() - want.view_as(out).float()).abs().max().item()
    sdpa = min(sdpa_gqa, sdpa_rep)
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_SIZE * k_cache.element_size()
    gbps = kv_bytes / ours / 1e9
    return {
        "batch": batch,
        "context": context,
        "dtype": dtype_name,
        "ours_us": round(ours * 1e6, 2),
        "sdpa_us": round(sdpa * 1e6, 2),
        "sdpa_gqa_us": round(sdpa_gqa * 1e6, 2),
        "sdpa_repeat_kv_us": round(sdpa_rep * 1e6, 2),
        "speedup_vs_sdpa": round(sdpa / ours, 3),
        "kv_bytes": kv_bytes,
        "kv_gb_per_s": round(gbps, 3),
        "memcpy_gb_per_s": round(memcpy_gbps, 3),
        "bandwidth_ratio": round(gbps / memcpy_gbps, 3),
        "max_abs_diff_vs_sdpa": diff,
    }


def attention_section(quick: bool) -> dict:
    if quick:
        shapes = [(1, 256), (8, 1024)]
        repeats, memcpy_bytes = 3, 64 << 20
    else:
        shapes = [(b, c) for b in (1, 8, 32, 64) for c in (256, 1024, 4096)]
        repeats, memcpy_bytes = 9, 256 << 20
    memcpy = Memcpy(memcpy_bytes)
    log(f"memcpy bandwidth ({memcpy_bytes >> 20} MiB buffer)")
    copy = median_seconds(memcpy, repeats)
    log(f"  {memcpy_bytes / copy / 1e9:.2f} GB/s")
    cases = []
    total = len(shapes) * len(DTYPES)
    for dtype_name in DTYPES:
        for batch, context in shapes:
            log(f"[{len(cases) + 1}/{total}] decode batch={batch} context={context} {dtype_name}")
            case = decode_case(batch, context, dtype_name, repeats, memcpy)
            log(
                f"  ours {case['ours_us']:.1f} us, sdpa {case['sdpa_us']:.1f} us "
                f"(x{case['speedup_vs_sdpa']:.2f}), {case['kv_gb_per_s']:.2f} GB/s "
                f"({case['bandwidth_ratio']:.2f} of memcpy {case['memcpy_gb_per_s']:.2f} GB/s)"
            )
            cases.append(case)
    batched = [c["speedup_vs_sdpa"] for c in cases if c["batch"] >= 8]
    long_ctx = [c["bandwidth_ratio"] for c in cases if c["context"] == 4096]
    summary: dict[str, object] = {}
    if batched:
        summary["min_speedup_vs_sdpa_batch_ge_8"] = min(batched)
        summary["target_speedup_met"] = min(batched) >= 1.0
    if long_ctx:
        summary["min_bandwidth_ratio_context_4096"] = min(long_ctx)
        summary["target_bandwidth_met"] = min(long_ctx) >= 0.5
    return {
        "geometry": geometry(),
        "repeats": repeats,
        "statistic": "median",
        "memcpy": {
            "buffer_bytes": memcpy_bytes,
            "gb_per_s": memcpy_bytes / copy / 1e9,
            "definition": "bytes copied per second by torch copy_ (read once, written once); "
            "each case's bandwidth_ratio uses copies timed alternately with that case's "
            "kernels (which also leaves every kernel a cold cache)",
        },
        "decode": cases,
        "summary": summary,
    }


def ragged_cache(
    q_lens: list[int], seq_lens: list[int], dtype: torch.dtype, gen: torch.Generator
) -> dict:
    """A paged cache holding every sequence's context under shuffled block ids."""
    need = [math.ceil(n / BLOCK_SIZE) for n in seq_lens]
    num_blocks = sum(need)
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(need)
    block_tables = torch.zeros(len(need), width, dtype=torch.int32)
    for s, n in enumerate(need):
        block_tables[s, :n] = torch.tensor([ids.pop() for _ in range(n)], dtype=torch.int32)
    shape = (num_blocks, NUM_KV_HEADS, BLOCK_SIZE, HEAD_SIZE)
    query_start = torch.tensor([0, *q_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return {
        "k_cache": torch.randn(shape, generator=gen).to(dtype),
        "v_cache": torch.randn(shape, generator=gen).to(dtype),
        "q": torch.randn(sum(q_lens), NUM_HEADS, HEAD_SIZE, generator=gen).to(dtype),
        "block_tables": block_tables,
        "plan": llmcore.AttentionPlan(
            query_start.numpy(),
            torch.tensor(seq_lens, dtype=torch.int32).numpy(),
            block_tables.numpy(),
            None,
            num_blocks=num_blocks,
        ),
    }


def sdpa_step(
    q_lens: list[int], seq_lens: list[int], data: dict
) -> tuple[Callable[[], torch.Tensor], int]:
    """torch SDPA over the same step with contiguous K/V (gathered outside the timing).

    Sequences with one query token (decode) share one padded call with a boolean
    mask, the way a dense engine batches them; every other sequence is one causal
    call (its queries are the last q_len positions of its context). Returns the
    step as a function giving the [tokens, heads, head_size] output, and the KV
    bytes the step reads once.
    """
    scale = 1.0 / math.sqrt(HEAD_SIZE)
    bt = data["block_tables"].long()

    def dense(cache: torch.Tensor, s: int, n: int) -> torch.Tensor:
        rows = cache[bt[s]].permute(1, 0, 2, 3).reshape(NUM_KV_HEADS, -1, HEAD_SIZE)
        return rows[:, :n].contiguous()

    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    decode = [s for s, n in enumerate(q_lens) if n == 1]
    prefill = [s for s, n in enumerate(q_lens) if n > 1]
    q = data["q"]
    kv_bytes = 2 * sum(seq_lens) * NUM_KV_HEADS * HEAD_SIZE * q.element_size()
    parts = []
    if decode:
        ctx = max(seq_lens[s] for s in decode)
        kd = torch.zeros(len(decode), NUM_KV_HEADS, ctx, HEAD_SIZE, dtype=q.dtype)
        vd = torch.zeros_like(kd)
        mask = torch.zeros(len(decode), 1, 1, ctx, dtype=torch.bool)
        for i, s in enumerate(decode):
            kd[i, :, : seq_lens[s]] = dense(data["k_cache"], s, seq_lens[s])
            vd[i, :, : seq_lens[s]] = dense(data["v_cache"], s, seq_lens[s])
            mask[i, ..., : seq_lens[s]] = True
        rows = torch.tensor([starts[s] for s in decode])
        qd = q[rows].unsqueeze(2)
        parts.append((rows, lambda qd=qd, kd=kd, vd=vd, mask=mask: F.scaled_dot_product_attention(
            qd, kd, vd, attn_mask=mask, scale=scale, enable_gqa=True).squeeze(2)))
    for s in prefill:
        n, ql = seq_lens[s], q_lens[s]
        ks, vs = dense(data["k_cache"], s, n), dense(data["v_cache"], s, n)
        qs = q[starts[s] : starts[s + 1]].transpose(0, 1).contiguous()
        # Causal with the queries at the end of the context (a cached prefix).
        mask = torch.ones(ql, n, dtype=torch.bool).tril(n - ql) if ql != n else None
        rows = torch.arange(starts[s], starts[s + 1])
        parts.append((rows, lambda qs=qs, ks=ks, vs=vs, mask=mask: F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True
        ).transpose(0, 1)))

    def step() -> torch.Tensor:
        out = torch.empty_like(q)
        for rows, fn in parts:
            out[rows] = fn()
        return out

    return step, kv_bytes


def engine_case(
    name: str, q_lens: list[int], seq_lens: list[int], dtype_name: str, repeats: int,
    memcpy: Memcpy, seed: int,
) -> dict:
    dtype = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(seed)
    data = ragged_cache(q_lens, seq_lens, dtype, gen)
    q, plan = data["q"], data["plan"]
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(HEAD_SIZE)

    def ours() -> None:
        llmcore.paged_attention(plan, q, data["k_cache"], data["v_cache"], out, scale)

    step, kv_bytes = sdpa_step(q_lens, seq_lens, data)
    t_ours, _ = median_pair(ours, memcpy, repeats)
    # Where the widest variant is past AVX2, the AVX2 one in the same run (its baseline).
    t_avx2 = None
    if llmcore.isa.current()["attention"] == "avx512":
        with llmcore.isa.capped("avx2", ("attention",)):
            t_avx2, _ = median_pair(ours, memcpy, repeats)
    with torch.inference_mode():
        want = step()
        t_sdpa, _ = median_pair(step, memcpy, repeats)
    diff = (out.float() - want.float()).abs().max().item()
    # q.k and p.v over every visible (query row, position) pair.
    visible = sum(
        sum(min(n, n - ql + t + 1) for t in range(ql)) for ql, n in zip(q_lens, seq_lens)
    )
    macs = 2 * visible * NUM_HEADS * HEAD_SIZE
    return {
        "case": name,
        "dtype": dtype_name,
        "num_seqs": len(q_lens),
        "num_tokens": sum(q_lens),
        "ours_us": round(t_ours * 1e6, 1),
        "sdpa_us": round(t_sdpa * 1e6, 1),
        "speedup_vs_sdpa": round(t_sdpa / t_ours, 3),
        "ours_avx2_us": None if t_avx2 is None else round(t_avx2 * 1e6, 1),
        "speedup_vs_avx2": None if t_avx2 is None else round(t_avx2 / t_ours, 3),
        "kv_gb_per_s": round(kv_bytes / t_ours / 1e9, 2),
        "gmac_per_s": round(macs / t_ours / 1e9, 2),
        "max_abs_diff_vs_sdpa": diff,
    }


def engine_shapes(rng: random.Random) -> list[tuple[str, list[int], list[int]]]:
    """The steps the engine runs on SmolLM2-135M (seeded, so every run times the same)."""
    decode_ctx = [rng.randint(200, 330) for _ in range(64)]
    prompts = [rng.randint(180, 220) for _ in range(10)]
    mixed_prompts = [rng.randint(180, 220) for _ in range(5)]
    mixed_ctx = [rng.randint(200, 330) for _ in range(32)]
    return [
        ("decode_64", [1] * 64, decode_ctx),
        ("prefill_10x200", prompts, prompts),
        ("prefill_1x250", [250], [250]),  # one prompt: the TTFT case
        ("mixed_5x200_32decode", mixed_prompts + [1] * 32, mixed_prompts + mixed_ctx),
    ]


def attention_engine_section(repeats: int) -> dict:
    memcpy = Memcpy(128 << 20)
    cases = []
    for name, q_lens, seq_lens in engine_shapes(random.Random(2024)):
        for dtype_name in DTYPES:
            log(f"engine shape {name} {dtype_name}")
            case = engine_case(name, q_lens, seq_lens, dtype_name, repeats, memcpy, len(cases))
            log(
                f"  ours {case['ours_us']:.1f} us, sdpa {case['sdpa_us']:.1f} us "
                f"(x{case['speedup_vs_sdpa']:.2f}), avx2 {case['ours_avx2_us']} us, "
                f"{case['gmac_per_s']:.1f} GMAC/s, "
                f"{case['kv_gb_per_s']:.2f} GB/s"
            )
            cases.append(case)
    return {
        "geometry": {**geometry(), "q_dtype": "same as the cache"},
        "repeats": repeats,
        "statistic": "median, each timed alternately with a 128 MiB copy (cold caches)",
        "cases": cases,
    }


def sampling_section(quick: bool) -> dict | None:
    scripts = str(Path(__file__).resolve().parent)
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    if importlib.util.find_spec("bench_sampling") is None:
        return None
    log("sampling (scripts/bench_sampling.py)")
    return importlib.import_module("bench_sampling").run(quick)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few shapes, few repeats")
    parser.add_argument(
        "--attention-engine-shapes",
        action="store_true",
        help="only the engine's decode / prefill / mixed attention steps vs torch SDPA",
    )
    parser.add_argument("--repeats", type=int, default=15, help="with --attention-engine-shapes")
    args = parser.parse_args()
    report: dict[str, object] = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            # Other work on the machine skews every number; recorded for context.
            "load_average_1m": os.getloadavg()[0],
            "llmcore_threads": llmcore.get_num_threads(),
            "torch_threads": torch.get_num_threads(),
            "attention_isa": llmcore.attention_isa(),
            "torch": torch.__version__,
            "llmcore": llmcore.version(),
        },
    }
    if args.attention_engine_shapes:
        report["attention_engine_shapes"] = attention_engine_section(args.repeats)
        print(json.dumps(report, indent=2))
        return
    report["quick"] = args.quick
    report["attention"] = attention_section(args.quick)
    sampling = sampling_section(args.quick)
    if sampling is not None:
        report["sampling"] = sampling
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
