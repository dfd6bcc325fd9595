"""How close single-sequence decode is to the memory bound: bytes a decode step reads over
its time, against this machine's memory bandwidth measured in the same run.

A decode step at concurrency 1 multiplies one row of activations by every weight matrix, so
its floor is the time to stream those matrices once. This script
  1. measures the copy bandwidth (STREAM "copy": read + write bytes) and the read bandwidth
     (a SIMD maximum over a buffer, one read) of a buffer far above the
     caches (--bw-mib, 1 GiB by default), and the read bandwidth of a buffer the size of
     one step's weights (what a decode sees if the last-level cache holds part of them),
     with the thread count the engine runs (each thread its own slice; numpy releases the
     GIL), in huge pages as the core keeps its packed weights;
  2. generates --tokens greedy tokens for one short prompt through the offline API
     (actors.LLM, the server's defaults: quantization "auto" keeps a GGUF's blocks) and
     takes the median time between consecutive tokens, the prefill step excluded;
  3. counts the bytes one decode step reads: every matrix the forward pass multiplies by at
     its stored size (packed quantized blocks, or the copy a load-time route sends M = 1 to),
     the LM head, the norm weights, one embedding row, and the KV cache at the median
     context (a sliding-window layer reads at most its window).
The bandwidth samples and the decode runs alternate (--repeats of each) so both see the
same load from other processes; the machine's load average is recorded too, and the
fastest run against the fastest samples ("least_disturbed"). --breakdown
then splits a decode step by core call (scripts/profile_step.py's timers), each with the
bytes it reads and the rate that makes, and the Python between them.

    python scripts/bench_decode_bw.py [--model gemma-3-270m] [--tokens 128] [--repeats 5]
        [--threads N] [--linear-routing on|off] [--breakdown] [--out FILE]

Prints one JSON document (also written to --out); progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from membw import Bandwidth, cpu_info  # noqa: E402  (a sibling script module)
from profile_step import Timers, instrument  # noqa: E402

TARGET = 0.6  # the share of the copy bandwidth a decode step should reach
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def log(msg: str) -> None:
    print(f"[bench_decode_bw] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------ bytes per step

def _nbytes(w: Any) -> int:
    if hasattr(w, "parts"):  # PackedParts: one packed matrix per part
        return sum(p.nbytes for p in w.parts)
    if hasattr(w, "nbytes") and not hasattr(w, "element_size"):
        return int(w.nbytes)  # PackedWeight
    return int(w.numel() * w.element_size())  # a torch tensor


def _read_at_m1(model: Any, w: Any) -> int:
    """Bytes M = 1 reads for matrix ``w``: its own, or the copy routing sends M = 1 to."""
    routing = getattr(model, "routing", None)
    if routing is not None and hasattr(w, "quant_type"):
        from actors.models import linear_routing

        kernel = routing.kernel(*w.shape, w.dtype, linear_routing.bucket(1))
        other = model._dense.get(id(w))
        if kernel != "core" and other is not None:
            return _nbytes(other)
    return _nbytes(w)


def routes_m1(model: Any) -> dict[str, str]:
    """"N x K format" -> the kernel the load-time routing chose for M = 1 (it is timed at
    load, so a busy machine can route a shape away from the core's own kernel)."""
    from actors.models import linear_routing

    routing = getattr(model, "routing", None)
    if routing is None:
        return {}
    return {f"{r.n}x{r.k} {r.weight_format}": r.kernel for r in routing.routes
            if r.m == linear_routing.BUCKETS[0]}


def step_bytes(eng: Any, context: float) -> dict[str, Any]:
    """What one decode step reads, by kind and by the operation that reads it (named as
    profile_step names them), at ``context`` tokens of KV cache."""
    import torch

    model, mc = eng.runner.model, eng.model_config
    if mc.arch.moe is not None:
        sys.exit("a mixture-of-experts model reads top-k experts a token; not modelled here")
    if not model.native:
        sys.exit("the model does not run the packed CPU forward pass (native); not modelled")
    plan = model.native_plan(1)
    ops = dict.fromkeys(("linear.qkv_proj", "linear.o_proj", "linear.gate_up_proj",
                         "linear.down_proj"), 0)
    biases = norms = 0
    for lp in plan.layers:
        for name, m in zip(ops, (lp.qkv, lp.o, lp.gate_up, lp.down)):
            ops[name] += _read_at_m1(model, m[1])
            biases += 0 if m[2] is None else _nbytes(m[2])  # fp32
        for t in (lp.in_norm, lp.q_norm, lp.k_norm, *lp.after_attn, *lp.after_mlp):
            norms += 0 if t is None else _nbytes(t)
    norms += _nbytes(plan.final_norm)
    head = model._logits_matrix()
    if head is None:  # an unpacked head (torch tensor)
        head = (model.lm_head.weight if model.lm_head is not None
                else model.model.embed_tokens.weight)
    emb = model._tied_packed
    emb_bytes = _nbytes(emb if emb is not None else model.model.embed_tokens.weight)
    kv_elem = torch.empty((), dtype=eng.kv_cache_dtype).element_size()
    kv = int(sum(2 * min(context, w or context) * mc.num_kv_heads * mc.head_dim * kv_elem
                 for w in mc.sliding_windows))
    ops.update({"lm_head": _read_at_m1(model, head), "attention.paged": kv, "rms_norm": norms})
    kinds = {"matrices": sum(ops[k] for k in ops if k.startswith("linear.")) + biases,
             "lm_head": ops["lm_head"], "norms": norms,
             "embedding_row": emb_bytes // mc.vocab_size, "kv_cache": kv}
    return {**kinds, "total": sum(kinds.values()), "by_op": ops}


# ------------------------------------------------------------------------ decode

def decode_run(llm: Any, prompt: list[int], tokens: int) -> dict[str, Any]:
    """One greedy generation through LLM.generate, each engine step timed: the gaps between
    consecutive steps' returns (the inter-token time the caller sees, detokenizing
    included) and the steps' own times, the first (prefill) step apart."""
    from actors import SamplingParams

    eng = llm.engine
    step = eng.step
    done: list[float] = []
    own: list[float] = []

    def timed() -> Any:
        t = time.perf_counter()
        out = step()
        done.append(time.perf_counter())
        own.append(done[-1] - t)
        return out

    eng.step = timed
    try:
        t0 = time.perf_counter()
        out = llm.generate([prompt], SamplingParams(max_tokens=tokens, temperature=0,
                                                    ignore_eos=True))
    finally:
        del eng.step
    n = len(out[0].outputs[0].token_ids)
    if n != tokens or len(done) != tokens:
        raise RuntimeError(f"expected {tokens} tokens in {tokens} steps, got {n} in "
                           f"{len(done)}")
    gaps = np.diff(done)
    return {"prefill_s": done[0] - t0, "inter_token_s": float(statistics.median(gaps)),
            "step_s": statistics.median(own[1:]), "tokens": out[0].outputs[0].token_ids}


def _wrapper_cost_s(timers_cls: Any, calls: int = 20000) -> float:
    """Seconds one timing wrapper adds to a call (a wrapped no-op against the bare one)."""
    timers = timers_cls()
    bare = lambda *a: None
    wrapped = timers.wrap(bare, "x")
    timers.on = True
    cost = []
    for fn in (bare, wrapped):
        t = time.perf_counter()
        for _ in range(calls):
            fn(1, 2, 3, 4)
        cost.append(time.perf_counter() - t)
    return max(0.0, cost[1] - cost[0]) / calls


def breakdown(llm: Any, prompt: list[int], tokens: int, by_op: dict[str, int]) -> dict[str, Any]:
    """Where a decode step's time goes: each core call timed (profile_step's wrappers) over
    one more generation, per step, with the bytes each operation reads and the rate that
    makes; "other" is the step's time the calls do not cover, less the wrappers' own cost:
    the Python around them (scheduler, inputs, sampling glue, the forward's plumbing) and
    torch's ops between them."""
    from actors import SamplingParams

    eng = llm.engine
    timers = instrument(eng)
    eng.add_request("breakdown", prompt, SamplingParams(max_tokens=tokens, temperature=0,
                                                        ignore_eos=True))
    eng.step()  # prefill
    timers.on = True
    t = time.perf_counter()
    while eng.has_unfinished():
        eng.step()
    step = (time.perf_counter() - t) / (tokens - 1)
    timers.on = False
    ms = {k: v / (tokens - 1) * 1e3 for k, v in timers.total.items()}
    calls = sum(timers.calls.values()) // (tokens - 1)
    wrappers_ms = calls * _wrapper_cost_s(Timers) * 1e3
    ops = {}
    for name, v in sorted(ms.items(), key=lambda kv: -kv[1]):
        row: dict[str, Any] = {"ms": round(v, 3), "share": round(v / 1e3 / step, 3),
                               "calls": timers.calls[name] // (tokens - 1)}
        if by_op.get(name):
            row["bytes"] = by_op[name]
            row["gb_s"] = round(by_op[name] / v / 1e6, 2)
        ops[name] = row
    return {"wrapped_step_ms": round(step * 1e3, 3), "calls_per_step": calls,
            "wrappers_ms_est": round(wrappers_ms, 3),
            "other_ms": round(step * 1e3 - sum(ms.values()) - wrappers_ms, 3), "ops": ops}


def least_disturbed(nbytes: int, runs: list[dict[str, Any]], copy: list[float],
                    read: list[float]) -> dict[str, Any]:
    """The fastest decode run against the fastest bandwidth samples: on a machine shared
    with other work, each side's least disturbed figure (the medians mix in others' load)."""
    inter = min(run["inter_token_s"] for run in runs)
    achieved = nbytes / inter / 1e9
    return {"inter_token_ms": round(inter * 1e3, 3), "achieved_gb_s": round(achieved, 2),
            "copy_gb_s": round(max(copy), 2), "read_gb_s": round(max(read), 2),
            "ratio_to_copy": round(achieved / max(copy), 3),
            "ratio_to_read": round(achieved / max(read), 3)}


# ------------------------------------------------------------------------ main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="as the server's --model (default: the "
                    "default SmolLM2 GGUF; gemma-3-270m: Gemma 3 270M Q4_K_M)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per run")
    ap.add_argument("--repeats", type=int, default=5, help="decode runs and bandwidth samples")
    ap.add_argument("--threads", type=int, default=None, help="engine threads (default: all)")
    ap.add_argument("--bw-mib", type=int, default=1024, help="bandwidth buffer size, MiB")
    ap.add_argument("--passes", type=int, default=3, help="bandwidth passes per sample (best)")
    ap.add_argument("--linear-routing", default="on", choices=["on", "off"],
                    help="as the server's: time the core against torch per shape at load")
    ap.add_argument("--breakdown", action="store_true", help="then time each core call "
                    "over one more generation (scripts/profile_step.py's wrappers)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    if args.tokens < 3 or args.repeats < 1:
        sys.exit("--tokens must be >= 3 and --repeats >= 1")

    import llmcore
    import torch
    from actors import LLM

    load0 = os.getloadavg()
    log(f"loading {args.model or 'the default model'}")
    llm = LLM(args.model, quantization="auto", num_threads=args.threads, max_model_len=2048,
              kv_cache_memory=256 << 20, linear_routing=args.linear_routing == "on")
    eng = llm.engine
    threads = llmcore.get_num_threads()
    assert threads == torch.get_num_threads()
    prompt = llm.tokenizer.encode(PROMPT, add_special_tokens=False)
    context = len(prompt) + args.tokens / 2  # the median decode step's KV length
    nbytes = step_bytes(eng, context)
    log(f"{threads} threads; one decode step reads {nbytes['total'] / 2**20:.1f} MiB")

    big = Bandwidth(args.bw_mib << 20, threads)
    ws = Bandwidth(-(-nbytes["total"] // (threads * 64)) * threads * 64, threads, copy=False)
    decode_run(llm, prompt, 8)  # warm-up: first-call allocations, the plan
    copy, read, read_ws, runs = [], [], [], []
    for r in range(args.repeats):
        time.sleep(0.3)  # the core's workers spin 200 ms after a parallel region
        copy.append(big.copy_gb_s(args.passes))
        read.append(big.read_gb_s(args.passes))
        read_ws.append(ws.read_gb_s(args.passes))
        runs.append(decode_run(llm, prompt, args.tokens))
        log(f"repeat {r + 1}/{args.repeats}: copy {copy[-1]:.1f} GB/s, read {read[-1]:.1f} "
            f"GB/s, read at the step's size {read_ws[-1]:.1f} GB/s, inter-token "
            f"{runs[-1]['inter_token_s'] * 1e3:.2f} ms")
    big.close()
    ws.close()
    if any(run["tokens"] != runs[0]["tokens"] for run in runs):
        raise RuntimeError("greedy decode gave different tokens across repeats")

    def med(xs: list[float], nd: int = 2) -> float:
        return round(statistics.median(xs), nd)

    inter = statistics.median(run["inter_token_s"] for run in runs)
    step = statistics.median(run["step_s"] for run in runs)
    achieved = nbytes["total"] / inter / 1e9
    out = {
        "benchmark": "decode_bw",
        "model": args.model or "default (SmolLM2-135M-Instruct Q4_1 GGUF)",
        "model_file": str(eng.model_dir),
        "weight_formats": eng.runner.model.weight_formats(),
        "kv_cache_dtype": str(eng.kv_cache_dtype).removeprefix("torch."),
        "linear_isa": llmcore.linear_isa(),
        "cpu": cpu_info(threads),
        "torch": torch.__version__,
        "loadavg_start": [round(x, 2) for x in load0],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "bandwidth": {
            "buffer_mib": args.bw_mib, "threads": threads, "huge_pages": "madvise",
            "copy_gb_s": med(copy), "read_gb_s": med(read),
            "read_at_step_bytes_gb_s": med(read_ws),
            "copy_gb_s_each": [round(x, 2) for x in copy],
            "read_gb_s_each": [round(x, 2) for x in read],
            "read_at_step_bytes_gb_s_each": [round(x, 2) for x in read_ws],
        },
        "decode": {
            "prompt_tokens": len(prompt), "tokens": args.tokens, "repeats": args.repeats,
            "context_tokens_median": context,
            "inter_token_ms_median": round(inter * 1e3, 3),
            "step_ms_median": round(step * 1e3, 3),
            "prefill_ms_median": med([run["prefill_s"] * 1e3 for run in runs]),
            "tok_s": round(1 / inter, 1),
            "inter_token_ms_each": [round(run["inter_token_s"] * 1e3, 3) for run in runs],
        },
        "bytes_per_step": nbytes,
        "routes_m1": routes_m1(eng.runner.model),
        "achieved_gb_s": round(achieved, 2),
        "achieved_gb_s_step_only": round(nbytes["total"] / step / 1e9, 2),
        "ratio_to_copy": round(achieved / statistics.median(copy), 3),
        "ratio_to_read": round(achieved / statistics.median(read), 3),
        "ratio_to_read_at_step_bytes": round(achieved / statistics.median(read_ws), 3),
        "target_ratio_to_copy": TARGET,
        "meets_target": bool(achieved / statistics.median(copy) >= TARGET),
        "least_disturbed": least_disturbed(nbytes["total"], runs, copy, read),
    }
    if args.breakdown:
        time.sleep(0.3)
        out["breakdown"] = breakdown(llm, prompt, args.tokens, nbytes["by_op"])
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
