#!/usr/bin/env python
"""bench_attention_rows: the core's CPU paged attention on the steps a serving engine runs,
called two ways, and (with --against) the same against another build of the core.

Cases (SmolLM2-135M's geometry: 9 query heads, 3 KV heads of 64, block size 16, shuffled
block tables; fp32 queries, bf16 and fp32 KV caches):

  prefill_8x250   8 sequences, each a 250-token prompt in one chunk
  decode_32x300   32 sequences decoding one token at context 300
  decode_1x2000   one sequence decoding one token at context 2000

Modes:

  core       the step's own plan (each sequence's query rows together)
  row_plans  every query row a sequence of its own, padded with idle rows to 4 x threads
             sequences: how the Python side once made attention batch-invariant

Every call is timed alternately with a 128 MiB copy, which evicts the K/V from the caches
(as in a model, where each layer's cache is cold); a case's figures are the median and
(".../min") the least time, and with --threads 1 (".../cpu") the median CPU time of the
call, which runs on the calling thread: on a machine shared with other jobs the wall times
swing with their load, the CPU time much less.

--against DIR runs the measurement in child processes, alternately with PYTHONPATH=DIR
(another build's llmcore package: the baseline) and with this script's own llmcore, for
--rounds rounds; it prints each side's medians over the rounds and the ratios
current / baseline. Without it, one measurement of this llmcore.

Prints one JSON document on stdout; progress on stderr.

    PYTHONPATH=python python scripts/bench_attention_rows.py [--threads 2] [--repeats 30] [--isa avx2]
    PYTHONPATH=python python scripts/bench_attention_rows.py --against /tmp/base --rounds 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HEADS, KV_HEADS, HEAD, BS = 9, 3, 64, 16
CASES = {  # name: (query rows per sequence, context per sequence)
    "prefill_8x250": ([250] * 8, [250] * 8),
    "decode_32x300": ([1] * 32, [300] * 32),
    "decode_1x2000": ([1], [2000]),
}
DTYPES = ("bfloat16", "float32")
MODES = ("core", "row_plans")


def log(msg: str) -> None:
    print(f"[bench_attention_rows] {msg}", file=sys.stderr, flush=True)


def measure(repeats: int, threads: int, isa: str | None) -> dict[str, float]:
    """Median microseconds per (case, dtype, mode) of the llmcore on sys.path."""
    import llmcore
    import numpy as np
    import torch

    if isa is not None:
        llmcore.isa.set_isa("attention", isa)
    llmcore.set_num_threads(threads)
    src = torch.ones(128 << 20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    results = {}
    for name, (q_lens, ctx) in CASES.items():
        gen = torch.Generator().manual_seed(len(results))
        per_seq = [math.ceil(c / BS) for c in ctx]
        num_blocks = sum(per_seq)
        table = np.zeros((len(ctx), max(per_seq)), dtype=np.int32)
        ids = torch.randperm(num_blocks, generator=gen).numpy().astype(np.int32)
        at = 0
        for s, n in enumerate(per_seq):
            table[s, :n] = ids[at: at + n]
            at += n
        query_start = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        seq_lens = np.array(ctx, dtype=np.int32)
        owner = np.repeat(np.arange(len(ctx)), q_lens)
        pos = np.concatenate([np.arange(c - q, c) for q, c in zip(q_lens, ctx)])
        rows = len(pos)
        core = llmcore.AttentionPlan(query_start, seq_lens, table, None, num_blocks=num_blocks)
        # one sequence per query row, padded with idle rows to 4 x threads sequences
        padded = max(rows, 4 * threads)
        row_lens = np.ones(padded, dtype=np.int32)
        row_lens[:rows] = pos + 1
        row_table = np.zeros((padded, table.shape[1]), dtype=np.int32)
        row_table[:rows] = table[owner]
        per_row = llmcore.AttentionPlan(np.arange(padded + 1, dtype=np.int32), row_lens,
                                        row_table, None, num_blocks=num_blocks)
        q = torch.randn(padded, HEADS, HEAD, generator=gen)
        out = torch.empty_like(q)
        for dtype_name in DTYPES:
            shape = (num_blocks, KV_HEADS, BS, HEAD)
            dtype = getattr(torch, dtype_name)
            k = torch.randn(shape, generator=gen).to(dtype)
            v = torch.randn(shape, generator=gen).to(dtype)
            calls = {"core": (core, q[:rows], out[:rows]), "row_plans": (per_row, q, out)}
            times: dict[str, list[float]] = {m: [] for m in MODES}
            cpu: dict[str, list[float]] = {m: [] for m in MODES}
            for i in range(repeats + 2):
                for mode in MODES:
                    plan, qm, om = calls[mode]
                    dst.copy_(src)
                    t0, c0 = time.perf_counter(), time.thread_time()
                    llmcore.paged_attention(plan, qm, k, v, om, HEAD ** -0.5)
                    if i >= 2:
                        times[mode].append(time.perf_counter() - t0)
                        cpu[mode].append(time.thread_time() - c0)
            for mode in MODES:
                key = f"{name}/{dtype_name}/{mode}"
                us, low = statistics.median(times[mode]) * 1e6, min(times[mode]) * 1e6
                results[key] = round(us, 1)
                results[f"{key}/min"] = round(low, 1)
                if threads == 1:
                    results[f"{key}/cpu"] = round(statistics.median(cpu[mode]) * 1e6, 1)
                log(f"{key}: {us:.1f} us (min {low:.1f})")
    return results


def against(baseline: str, rounds: int, repeats: int, threads: int, isa: str | None) -> dict:
    """Alternate child measurements of the baseline's llmcore and this one's."""
    own = str(Path(__file__).resolve().parents[1] / "python")
    sides = {"baseline": baseline, "current": own}
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
    for r in range(rounds):
        for side in (sides if r % 2 == 0 else reversed(list(sides))):
            log(f"round {r + 1}: {side}")
            env = {**os.environ, "PYTHONPATH": sides[side]}
            done = subprocess.run(
                [sys.executable, __file__, "--threads", str(threads), "--repeats", str(repeats),
                 *(["--isa", isa] if isa else [])],
                env=env, capture_output=True, text=True, check=True)
            runs[side].append(json.loads(done.stdout)["us"])
    # medians over the rounds of each round's medians; of the minima, the least
    med = {s: {key: round((min if key.endswith("/min") else statistics.median)(
        run[key] for run in runs[s]), 1) for key in runs[s][0]} for s in sides}
    ratios = {key: round(med["current"][key] / med["baseline"][key], 3)
              for key in med["current"]}
    return {"rounds": rounds, "us": med, "current_over_baseline": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per case and mode")
    parser.add_argument("--against", metavar="DIR", help="a baseline llmcore's PYTHONPATH")
    parser.add_argument("--rounds", type=int, default=3, help="with --against")
    parser.add_argument("--isa", choices=("scalar", "avx2", "avx512"),
                        help="cap the attention kernels (default: the best this CPU runs)")
    args = parser.parse_args()
    doc = {"geometry": {"heads": HEADS, "kv_heads": KV_HEADS, "head_size": HEAD,
                        "block_size": BS, "q_dtype": "float32"},
           "threads": args.threads, "repeats": args.repeats, "isa": args.isa or "best",
           "statistic": "us per call (median; /min: least), each after a 128 MiB copy (cold caches)"}
    if args.against:
        doc.update(against(args.against, args.rounds, args.repeats, args.threads, args.isa))
    else:
        doc["us"] = measure(args.repeats, args.threads, args.isa)
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
