"""Beam search against n-choice sampling on the engine: the cost of the search.

Both modes run the same closed loop on the default model (or --model): --requests requests,
--concurrency of them in flight (a finished one is replaced at once), each a distinct
--prompt-tokens prompt and --max-tokens new tokens per choice with EOS ignored, so both
modes compute the same number of tokens:

  beam:   n = --width beams (use_beam_search), the engine's search;
  sample: n = --width sampled choices (temperature 1, seeded).

Reports per mode the median request latency, the median time per step, and returned
tokens/s (choices x tokens over the wall time), and the beam/sample ratios. Prints one
JSON document; progress goes to stderr.

    python scripts/bench_beam.py [--width 4] [--concurrency 8] [--requests 16] [--quick]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Any


def log(msg: str) -> None:
    print(f"[bench_beam] {msg}", file=sys.stderr, flush=True)


def prompts(tokenizer: Any, count: int, length: int) -> list[list[int]]:
    words = ("river mountain ledger violet copper lantern harbor orchard signal meadow "
             "archive tundra velvet quartz compass ember").split()
    out = []
    for salt in range(count):  # no shared prefix: the prefix cache skips nothing
        rng = random.Random(salt)
        text = " ".join(rng.choice(words) for _ in range(length * 2))
        out.append(tokenizer.encode(text, add_special_tokens=False)[:length])
    return out


def run(llm: Any, mode: str, work: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    from actors import SamplingParams

    if mode == "beam":
        params = SamplingParams(n=args.width, use_beam_search=True, max_tokens=args.max_tokens,
                                ignore_eos=True)
    else:
        params = SamplingParams(n=args.width, temperature=1.0, seed=0,
                                max_tokens=args.max_tokens, ignore_eos=True)
    engine = llm.engine
    todo = list(enumerate(work))
    started: dict[str, float] = {}
    open_choices: dict[str, int] = {}
    latencies, steps = [], []
    tokens = 0
    t0 = time.perf_counter()
    while todo or open_choices:
        while todo and len(open_choices) < args.concurrency:
            i, ids = todo.pop(0)
            rid = f"{mode}-{i}"
            engine.add_request(rid, ids, params)
            started[rid], open_choices[rid] = time.perf_counter(), args.width
        s0 = time.perf_counter()
        batch = engine.step()
        now = time.perf_counter()
        steps.append(now - s0)
        for out in batch.outputs:
            tokens += len(out.new_token_ids)
            if out.finished:
                open_choices[out.request_id] -= 1
                if not open_choices[out.request_id]:
                    del open_choices[out.request_id]
                    latencies.append(now - started[out.request_id])
                    log(f"{mode}: {len(latencies)}/{len(work)} requests done")
    wall = time.perf_counter() - t0
    return {"requests": len(latencies), "steps": len(steps), "wall_s": round(wall, 3),
            "median_latency_s": round(statistics.median(latencies), 4),
            "median_step_ms": round(1000 * statistics.median(steps), 3),
            "returned_tokens": tokens, "returned_tokens_per_s": round(tokens / wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model path (default: SmolLM2 GGUF)")
    ap.add_argument("--width", type=int, default=4, help="beams, and choices when sampling")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: all)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.concurrency, args.max_tokens, args.prompt_tokens = 2, 2, 4, 16

    from actors import LLM

    kw: dict[str, Any] = dict(max_model_len=1024, kv_cache_memory=256 << 20)
    if args.threads is not None:
        kw["num_threads"] = args.threads
    log("loading the model")
    llm = LLM(args.model, **kw)
    work = prompts(llm.tokenizer, args.requests, args.prompt_tokens)
    run(llm, "sample", work[:1], argparse.Namespace(**{**vars(args), "concurrency": 1}))
    result: dict[str, Any] = {"workload": {k: getattr(args, k) for k in (
        "width", "concurrency", "requests", "prompt_tokens", "max_tokens")}}
    for mode in ("beam", "sample"):
        log(f"{mode}: {args.requests} requests at concurrency {args.concurrency}")
        result[mode] = run(llm, mode, work, args)
    b, s = result["beam"], result["sample"]
    result["ratio_beam_over_sample"] = {
        "median_latency": round(b["median_latency_s"] / s["median_latency_s"], 3),
        "median_step": round(b["median_step_ms"] / s["median_step_ms"], 3),
        "returned_tokens_per_s": round(b["returned_tokens_per_s"]
                                       / s["returned_tokens_per_s"], 3)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
