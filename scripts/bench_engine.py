"""Engine benchmark: our engine against transformers' generate on the same weights.

Two workloads, both measured in this run on the default model (or --model):
  (a) one sequence, 256-token prompt, 256 new tokens: prefill time and decode tokens/s;
  (b) 64 sequences of ~200 prompt tokens, 128 new tokens each (ignore EOS): total output
      tokens/s; transformers generates the same work in static batches of 8;
  (c) ours only: time to the first token of one 256-, 1024- and 4096-token prompt.
Each side runs in its own subprocess so its peak memory (max RSS) is its own.
Prints one JSON document; progress goes to stderr.

    python scripts/bench_engine.py [--quick] [--dtype auto] [--quantization gguf]
        [--quantization-activations int16|int8] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def log(msg: str) -> None:
    print(f"[bench_engine] {msg}", file=sys.stderr, flush=True)


def workload(tokenizer: Any, quick: bool) -> dict[str, Any]:
    """Deterministic prompts of the requested token lengths."""
    words = ("river mountain ledger violet copper lantern harbor orchard signal meadow "
             "archive tundra velvet quartz compass ember").split()

    def prompt(n: int, salt: int) -> list[int]:
        # A seeded random word sequence per prompt: no two prompts share a prefix, so the
        # prefix cache (ours, on by default) cannot skip any of the work transformers does.
        rng = random.Random(salt)
        text = " ".join(rng.choice(words) for _ in range(n * 2))
        return tokenizer.encode(text, add_special_tokens=False)[:n]

    if quick:
        return {"single": (prompt(32, 0), 16), "batch": ([prompt(24, s) for s in range(8)], 8),
                "hf_batch": 4, "ttft_lengths": [64], "prompt": prompt}
    return {"single": (prompt(256, 0), 256),
            "batch": ([prompt(190 + (s % 21), s) for s in range(64)], 128), "hf_batch": 8,
            "ttft_lengths": [256, 1024, 4096], "prompt": prompt}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------------- our engine


def run_ours(args: argparse.Namespace) -> dict[str, Any]:
    from actors import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(args.model, dtype=args.dtype, quantization=args.quantization,
              quantization_activations=args.quantization_activations,
              num_threads=args.threads, max_num_seqs=64, max_num_batched_tokens=args.max_num_batched_tokens,
              kv_cache_memory=args.kv_cache_memory, kv_cache_dtype=args.kv_cache_dtype,
              max_model_len=4352)
    load_s = time.perf_counter() - t0
    work = workload(llm.tokenizer, args.quick)
    eng = llm.engine

    # (a) prefill and decode of one sequence, timed step by step.
    prompt, new = work["single"]
    llm.generate([prompt[:16]], SamplingParams(max_tokens=4, temperature=0))  # warm up
    eng.add_request("single", prompt, SamplingParams(max_tokens=new, temperature=0,
                                                     ignore_eos=True))
    steps: list[float] = []
    produced = 0
    while eng.has_unfinished_requests():
        t = time.perf_counter()
        outs = eng.step().outputs
        steps.append(time.perf_counter() - t)
        produced += sum(len(o.new_token_ids) for o in outs)
    # The first step that yields a token ends the prefill (a long prompt may take several).
    prefill_steps = -(-len(prompt) // args.max_num_batched_tokens)
    prefill_s = sum(steps[:prefill_steps])
    decode = steps[prefill_steps:]
    log(f"ours (a): prefill {prefill_s * 1e3:.1f} ms, decode {len(decode) / sum(decode):.1f} tok/s")

    # (b) the batch.
    prompts, new_b = work["batch"]
    params = SamplingParams(max_tokens=new_b, temperature=0, ignore_eos=True)
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t
    total = sum(len(o.outputs[0].token_ids) for o in outs)
    log(f"ours (b): {total} tokens in {elapsed:.1f} s = {total / elapsed:.1f} tok/s")

    # (c) time to the first token of one prompt of each length (distinct prompts: no prefix
    # cache hit), median of 3 (1 with --quick).
    ttft: dict[str, float] = {}
    for n in work["ttft_lengths"]:
        times = []
        for rep in range(1 if args.quick else 3):
            p = work["prompt"](n, 1000 * n + rep)
            eng.add_request(f"ttft{n}-{rep}", p, SamplingParams(max_tokens=1, temperature=0))
            t = time.perf_counter()
            while eng.has_unfinished_requests():
                eng.step()
            times.append(time.perf_counter() - t)
        ttft[str(n)] = round(statistics.median(times) * 1e3, 1)
        log(f"ours (c): TTFT {n} tokens {ttft[str(n)]} ms")
    return {
        "load_s": round(load_s, 2),
        "dtype": str(eng.dtype).removeprefix("torch."),
        "quantization": eng.config.quantization,  # "auto" resolved
        "quantization_activations": args.quantization_activations,
        "kv_cache_dtype": str(eng.kv_cache_dtype).removeprefix("torch."),
        "prefill_s": round(prefill_s, 4),
        "prefill_tokens": len(prompt),
        "decode_tok_s": round(len(decode) / sum(decode), 2),
        "decode_ms_per_token_median": round(statistics.median(decode) * 1e3, 3),
        "batch_output_tokens": total,
        "batch_s": round(elapsed, 3),
        "batch_tok_s": round(total / elapsed, 2),
        "ttft_ms_by_prompt_tokens": ttft,
        "weight_formats": eng.loaded.model.weight_formats(),
        "peak_rss_mib": round(peak_rss_mib(), 1),
    }


# ---------------------------------------------------------------------- transformers


def run_hf(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from actors.loader import default_model_path
    from actors.loader.reference import transformers_reference

    if args.threads:
        torch.set_num_threads(args.threads)
    source = args.model or default_model_path()
    from actors.loader import prepare_model_dir
    from transformers import AutoTokenizer

    _, model_dir, _ = prepare_model_dir(source)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    t0 = time.perf_counter()
    # float32, transformers' default, from the converted directory: the same weights as the
    # GGUF (de-quantized once), without transformers' own GGUF path (20-60 s a load here).
    model = transformers_reference(model_dir)
    load_s = time.perf_counter() - t0
    work = workload(tok, args.quick)

    def generate(batch: list[list[int]], new: int) -> tuple[float, int]:
        width = max(len(p) for p in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for i, p in enumerate(batch):  # left padding, as generate expects
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new,
                                 min_new_tokens=new, do_sample=False, temperature=None,
                                 top_p=None, top_k=None, pad_token_id=0)
        return time.perf_counter() - t, (out.shape[1] - width) * len(batch)

    prompt, new = work["single"]
    generate([prompt[:16]], 4)  # warm up
    prefill_s, _ = generate([prompt], 1)
    total_s, _ = generate([prompt], new)
    decode_tok_s = (new - 1) / max(total_s - prefill_s, 1e-9)
    log(f"transformers (a): prefill {prefill_s * 1e3:.1f} ms, decode {decode_tok_s:.1f} tok/s")

    prompts, new_b = work["batch"]
    hb = work["hf_batch"]
    elapsed, total = 0.0, 0
    for i in range(0, len(prompts), hb):
        dt, n = generate(prompts[i:i + hb], new_b)
        elapsed += dt
        total += n
        log(f"transformers (b): {i + hb}/{len(prompts)} sequences, {total / elapsed:.1f} tok/s")
    return {
        "load_s": round(load_s, 2),
        "dtype": "float32",
        "prefill_s": round(prefill_s, 4),
        "decode_tok_s": round(decode_tok_s, 2),
        "static_batch": hb,
        "batch_output_tokens": total,
        "batch_s": round(elapsed, 3),
        "batch_tok_s": round(total / elapsed, 2),
        "peak_rss_mib": round(peak_rss_mib(), 1),
    }


# ---------------------------------------------------------------------- driver


def side(name: str, argv: list[str]) -> dict[str, Any]:
    log(f"running {name} in a subprocess")
    # The child imports exactly what this process imports.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run([sys.executable, __file__, "--side", name, *argv], env=env,
                         stdout=subprocess.PIPE, check=True, text=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model path (default: SmolLM2 GGUF)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--quantization", default=None, choices=["auto", "none", "gguf", "int8"],
                    help="keep the GGUF matrices quantized, or quantize to int8 (our side "
                    "only)")
    ap.add_argument("--quantization-activations", default="int16", choices=["int16", "int8"],
                    help="what quantized matrices meet (our side only)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: all)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--kv-cache-memory", type=int, default=1 << 30)
    ap.add_argument("--kv-cache-dtype", default="auto", help="auto | float32 | bfloat16")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    ap.add_argument("--side", choices=["ours", "hf"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        print(json.dumps(run_ours(args) if args.side == "ours" else run_hf(args)))
        return
    argv = [a for a in sys.argv[1:]]
    ours = side("ours", argv)
    hf = side("hf", argv)
    result = {
        "benchmark": "engine",
        "quick": args.quick,
        "threads": args.threads,
        "ours": ours,
        "transformers": hf,
        "ratios": {
            "decode_tok_s": round(ours["decode_tok_s"] / hf["decode_tok_s"], 2),
            "prefill_speedup": round(hf["prefill_s"] / ours["prefill_s"], 2),
            "batch_tok_s": round(ours["batch_tok_s"] / hf["batch_tok_s"], 2),
        },
        "targets": {"decode_tok_s": 3.0, "batch_tok_s": 8.0},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
