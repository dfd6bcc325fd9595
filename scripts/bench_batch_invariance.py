"""What batch invariance costs: offline throughput of one batch of 32 x 250-token prompts
(distinct; prefix caching off, so every round computes them all), greedy, --new-tokens each, in three engine modes on the default
model (or --model) as the server loads it (--quantization auto):

  invariant       the default (EngineConfig.batch_invariant): each row's linear kernels by
                  its role (actors.models.row_kernels), nothing routed by timing
  routed          --no-batch-invariant: linear routing timed at load
  core_attention  --no-batch-invariant --linear-routing off: every matrix on the core's
                  own kernel for every row
(The core's attention is the same in all three: it gives a row the same bits in any call.)

Each mode loads its own copy of the model (routing changes a model for every engine that
shares it). --rounds rounds run every mode in turn, the order reversed every other round
(a burst of load on the shared machine falls on all of them); per round: prefill seconds
(the steps until every prompt has its first token), decode tok/s (the steps after) and
total output tok/s; then the medians and each mode's ratio to invariant. Also how many of
the 32 outputs differ from the invariant engine's (routing changes the rounding).

Prints one JSON object on stdout; progress on stderr.

    PYTHONPATH=python python scripts/bench_batch_invariance.py [--rounds 3] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Any

import llmcore
import torch

MODES = {
    "invariant": {"batch_invariant": True, "linear_routing": True},
    "routed": {"batch_invariant": False, "linear_routing": True},
    "core_attention": {"batch_invariant": False, "linear_routing": False},
}


def log(msg: str) -> None:
    print(f"[bench_batch_invariance] {msg}", file=sys.stderr, flush=True)


def prompts(tokenizer: Any, count: int, length: int) -> list[list[int]]:
    words = ["river", "mountain", "ledger", "violet", "copper", "lantern", "harbor", "orchard", "signal", "meadow", "archive", "tundra", "velvet", "quartz", "compass", "ember"]
    out = []
    for salt in range(count):
        rng = random.Random(salt)
        text = " ".join(rng.choice(words) for _ in range(length * 2))
        out.append(tokenizer.encode(text, add_special_tokens=False)[:length])
    return out


def run_batch(engine: Any, tag: str, batch: list[list[int]], new_tokens: int
              ) -> tuple[dict[str, float], list[list[int]]]:
    from actors import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    for i, ids in enumerate(batch):
        engine.add_request(f"{tag}-{i}", ids, params)
    tokens: dict[str, list[int]] = {f"{tag}-{i}": [] for i in range(len(batch))}
    prefill_s = decode_s = 0.0
    decode_tokens = 0
    t_all = time.perf_counter()
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        outs = engine.step().outputs
        dt = time.perf_counter() - t
        started = all(tokens.values())
        for o in outs:
            tokens[o.request_id].extend(o.new_token_ids)
        if started:
            decode_s += dt
            decode_tokens += sum(len(o.new_token_ids) for o in outs)
        else:
            prefill_s += dt
    total_s = time.perf_counter() - t_all
    row = {"prefill_s": round(prefill_s, 3),
           "decode_tok_s": round(decode_tokens / decode_s, 1) if decode_s else None,
           "total_tok_s": round(len(batch) * new_tokens / total_s, 1)}
    return row, [tokens[f"{tag}-{i}"] for i in range(len(batch))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=250)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    args = p.parse_args()
    from actors import LLM

    engines = {}
    for mode in args.modes:
        log(f"loading {mode}")
        engines[mode] = LLM(args.model, quantization="auto", num_threads=args.threads,
                            max_num_seqs=args.prompts, kv_cache_memory=512 << 20,
                            enable_prefix_caching=False,  # every round computes every prompt
                            max_model_len=args.prompt_tokens + args.new_tokens + 16,
                            **MODES[mode]).engine
    first = next(iter(engines.values()))
    batch = prompts(first.tokenizer, args.prompts, args.prompt_tokens)
    for mode, eng in engines.items():  # warm-up: first-touch pages, thread pools
        run_batch(eng, f"warm-{mode}", batch[:4], 4)
    rounds: list[dict[str, dict[str, float]]] = []
    outputs: dict[str, list[list[int]]] = {}
    for r in range(args.rounds):
        order = list(engines.items())
        row = {}
        for mode, eng in order if r % 2 == 0 else order[::-1]:
            row[mode], outputs[mode] = run_batch(eng, f"{r}-{mode}", batch, args.new_tokens)
            log(f"round {r} {mode:15s} {row[mode]}")
        rounds.append(row)
    medians = {mode: {k: statistics.median(rd[mode][k] for rd in rounds)
                      for k in ("prefill_s", "decode_tok_s", "total_tok_s")}
               for mode in engines}
    base = medians.get("invariant")
    ratios = {} if base is None else {
        mode: {k: round(m[k] / base[k], 3) for k in m} for mode, m in medians.items()}
    ref = outputs.get("invariant")
    differ = {} if ref is None else {
        mode: sum(a != b for a, b in zip(out, ref)) for mode, out in outputs.items()}
    print(json.dumps({
        "threads": args.threads, "linear_isa": llmcore.linear_isa(),
        "attention_isa": llmcore.attention_isa(), "prompts": args.prompts,
        "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
        "rounds": rounds, "median": medians, "ratio_to_invariant": ratios,
        "outputs_differing_from_invariant": differ,
        "linear_routing": {mode: None if eng.linear_routing is None
                           else eng.linear_routing.as_dict()["routes"]
                           for mode, eng in engines.items()},
    }, indent=1))


if __name__ == "__main__":
    main()
