"""Fast-forward of grammar-forced tokens: what it saves, on and off in the same run.

One offline engine over the default model (or --model); every request constrained by a JSON
schema with long fixed keys and an enum. Rounds alternate fast-forward on and off (the
sampler's switch, same weights, same engine), so the machine's noise falls on both alike.
Per batch size: output tokens/s, model steps per output token and request latency,
medians over the rounds, and the on/off ratios. Outputs are checked equal between the two
modes (greedy). Prints one JSON document; progress goes to stderr.

    python scripts/bench_fast_forward.py [--batch 1,8] [--rounds 5] [--max-tokens 160]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Any

SCHEMA = {
    "type": "object",
    "properties": {
        "customer_identification_number": {"type": "integer", "minimum": 0, "maximum": 99999},
        "shipping_address_first_line": {"type": "string", "maxLength": 24},
        "preferred_delivery_time_window": {
            "type": "string", "enum": ["morning_before_noon", "afternoon_after_noon"]},
        "is_gift_wrapping_requested": {"type": "boolean"},
    },
    "required": ["customer_identification_number", "shipping_address_first_line",
                 "preferred_delivery_time_window", "is_gift_wrapping_requested"],
    "additionalProperties": False,
}
QUESTIONS = ["Give me an order record as JSON.", "Describe a parcel order.",
             "Fill in the delivery form for Ana.", "One more order, please.",
             "An order for a gift to Lisbon.", "Record the order of customer 17.",
             "A morning delivery order.", "The order Tom placed yesterday."]


def log(msg: str) -> None:
    print(f"[bench_fast_forward] {msg}", file=sys.stderr, flush=True)


def one_round(llm: Any, prompts: list[str], params: Any, fast_forward: bool
              ) -> tuple[float, int, int, list[tuple[int, ...]]]:
    """(seconds, output tokens, model steps, token ids per request)."""
    llm.engine.runner.sampler.fast_forward = fast_forward
    steps0 = llm.engine.scheduler.stats().num_steps
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    dt = time.perf_counter() - t0
    steps = llm.engine.scheduler.stats().num_steps - steps0
    ids = [tuple(o.outputs[0].token_ids) for o in outs]
    return dt, sum(len(i) for i in ids), steps, ids


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model directory or .gguf (default model)")
    ap.add_argument("--batch", default="1,8", help="comma-separated batch sizes")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16")
    args = ap.parse_args(argv)

    from actors.llm import LLM
    from actors.params.sampling import SamplingParams
    from actors.params.structured import StructuredSpec

    log("loading the model")
    llm = LLM(args.model, max_model_len=1024, kv_cache_memory=256 << 20,
              num_threads=args.threads, dtype=args.dtype)
    spec = StructuredSpec("json", json.dumps(SCHEMA))
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, structured=spec)
    results: dict[str, Any] = {}
    for batch in (int(b) for b in args.batch.split(",")):
        qs = [QUESTIONS[i % len(QUESTIONS)] for i in range(batch)]
        prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                                     add_generation_prompt=True, tokenize=False)
                   for q in qs]
        one_round(llm, prompts, params, True)  # warm: compile, caches
        rows: dict[bool, list[tuple[float, int, int]]] = {True: [], False: []}
        ids_by_mode: dict[bool, list[tuple[int, ...]]] = {}
        for r in range(args.rounds):
            for mode in ((True, False) if r % 2 == 0 else (False, True)):
                dt, toks, steps, ids = one_round(llm, prompts, params, mode)
                rows[mode].append((dt, toks, steps))
                ids_by_mode[mode] = ids
            log(f"batch {batch} round {r + 1}/{args.rounds}")
        summary = {}
        for mode, name in ((True, "on"), (False, "off")):
            dts = [x[0] for x in rows[mode]]
            toks = rows[mode][0][1]
            steps = rows[mode][0][2]
            summary[name] = {
                "output_tokens": toks,
                "model_steps": steps,
                "steps_per_output_token": round(steps / toks, 4),
                "tokens_per_s_median": round(statistics.median(toks / d for d in dts), 2),
                "round_seconds_median": round(statistics.median(dts), 4),
            }
        summary["outputs_equal"] = ids_by_mode[True] == ids_by_mode[False]
        summary["tokens_per_s_ratio_on_off"] = round(
            summary["on"]["tokens_per_s_median"] / summary["off"]["tokens_per_s_median"], 3)
        summary["steps_ratio_on_off"] = round(
            summary["on"]["model_steps"] / summary["off"]["model_steps"], 3)
        results[f"batch_{batch}"] = summary
    doc = {
        "benchmark": "structured outputs fast-forward (grammar-forced tokens)",
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "isa": _isa()},
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "dtype": str(llm.engine.info.dtype) if hasattr(llm.engine.info, "dtype") else args.dtype,
        "schema": "4 required keys of 26-30 characters, a 2-member enum, bounded integer",
        "results": results,
    }
    print(json.dumps(doc, indent=2))
    return 0


def _isa() -> str:
    import llmcore

    return llmcore.linear_isa()


if __name__ == "__main__":
    raise SystemExit(main())
