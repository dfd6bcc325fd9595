"""Where an engine step's time goes: decode steps of a batch of sequences, split by the core
call that spends it (each projection, attention, the elementwise ops, the LM head, sampling)
and the Python around them.

Every timed function is wrapped in place with a perf_counter pair, so the split costs a few
microseconds per call (reported as "wrapper_overhead_ms_est"); the step totals are measured
separately without wrappers in the same run. Prints one JSON document; progress on stderr.

    python scripts/profile_step.py [--batch 64] [--context 256] [--steps 16] [--kv-cache-dtype auto]
"""

from __future__ import annotations

import argparse
import collections
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def log(msg: str) -> None:
    print(f"[profile_step] {msg}", file=sys.stderr, flush=True)


class Timers:
    def __init__(self) -> None:
        self.total: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)
        self.on = False

    def wrap(self, fn: Callable, name: Callable[..., str] | str) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            key = name(*args) if callable(name) else name
            self.total[key] += time.perf_counter() - t
            self.calls[key] += 1
            return out
        return timed


def instrument(eng: Any) -> Timers:
    """Wraps the core's entry points with ``Timers`` (off until ``timers.on``), each linear
    named by its projection, and makes the engine's forward pass take the wrapped ones."""
    import llmcore

    timers = Timers()
    c = llmcore._C
    mc = eng.model_config
    # a fused matrix kept as parts of mixed formats (PackedParts) runs one product per part
    shapes = {mc.q_size + 2 * mc.kv_size: "qkv_proj", mc.hidden_size: "o_or_down_proj",
              2 * mc.intermediate_size: "gate_up_proj", mc.q_size: "qkv_proj",
              mc.kv_size: "qkv_proj", mc.intermediate_size: "gate_up_proj"}

    def lin_name(x: Any, w: Any, *rest: Any) -> str:
        n = w.shape[0]
        if n == mc.vocab_size:
            return "lm_head"
        if n == mc.hidden_size:
            return "linear.o_proj" if x.shape[1] == mc.q_size else "linear.down_proj"
        return "linear." + shapes.get(n, f"n{n}")

    c.linear = timers.wrap(c.linear, lin_name)
    # A shape the load-time routing sent to torch (actors.models.linear_routing) runs there
    # instead, under the same name: the split is by projection, whichever kernel ran it.
    from actors.models import linear_routing

    linear_routing.torch_linear = timers.wrap(linear_routing.torch_linear, lin_name)
    c.rms_norm = timers.wrap(c.rms_norm, "rms_norm")
    c.rope = timers.wrap(c.rope, "rope")
    c.silu_mul = timers.wrap(c.silu_mul, "silu_mul")
    llmcore.kv_store = timers.wrap(llmcore.kv_store, "attention.kv_store")
    llmcore.paged_attention = timers.wrap(llmcore.paged_attention, "attention.paged")
    llmcore.AttentionPlan = timers.wrap(llmcore.AttentionPlan, "attention.plan")
    llmcore.sample = timers.wrap(llmcore.sample, "sampling")
    # The forward's per-layer plan holds the kernels it found at the first step: rebuilt,
    # it takes the wrapped ones.
    forget = getattr(eng.runner.model, "forget_plan", None)
    if forget is not None:
        forget()
    return timers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=256, help="prompt tokens per sequence")
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--quantization", default="auto", help="as the server's -q (auto: a GGUF "
                    "keeps its blocks)")
    ap.add_argument("--kv-cache-memory", type=int, default=1 << 30,
                    help="bytes; must hold batch x (context + 2 x steps + 8) tokens")
    args = ap.parse_args()

    import llmcore
    import numpy as np
    from actors import LLM, SamplingParams

    llm = LLM(args.model, num_threads=args.threads, max_num_seqs=args.batch,
              max_num_batched_tokens=4096, kv_cache_memory=args.kv_cache_memory,
              kv_cache_dtype=args.kv_cache_dtype, max_model_len=2048,
              quantization=args.quantization)
    eng = llm.engine
    rng = np.random.default_rng(0)
    vocab = eng.vocab_size
    params = SamplingParams(max_tokens=2 * args.steps + 8, temperature=0, ignore_eos=True)
    for i in range(args.batch):
        prompt = rng.integers(100, vocab - 100, args.context).tolist()
        eng.add_request(f"r{i}", prompt, params)
    log(f"prefilling {args.batch} x {args.context} tokens")
    need = args.batch * (args.context + 2 * args.steps + 8)
    if need > eng.num_blocks * eng.config.block_size:
        sys.exit(f"the KV cache holds {eng.num_blocks * eng.config.block_size} tokens, the batch "
                 f"needs {need}: raise --kv-cache-memory")
    while True:  # until every sequence decodes (one token per step)
        eng.step()
        if all(s.num_computed_tokens >= args.context for s in eng.scheduler.running) and \
                len(eng.scheduler.running) == args.batch:
            break
    eng.step()

    plain = []
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(args.steps):
        t = time.perf_counter()
        eng.step()
        plain.append(time.perf_counter() - t)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / args.steps

    timers = instrument(eng)

    wrapped = []
    timers.on = True
    for _ in range(args.steps):
        t = time.perf_counter()
        eng.step()
        wrapped.append(time.perf_counter() - t)
    timers.on = False
    calls = sum(timers.calls.values())
    step_ms = statistics.median(plain) * 1e3
    parts = {k: round(v / args.steps * 1e3, 3) for k, v in sorted(timers.total.items(),
                                                                     key=lambda kv: -kv[1])}
    covered = sum(parts.values())
    wrapped_ms = statistics.median(wrapped) * 1e3
    out = {
        "benchmark": "profile_step",
        "batch": args.batch,
        "context": args.context,
        "kv_cache_dtype": str(eng.kv_cache_dtype).removeprefix("torch."),
        "threads": llmcore.get_num_threads(),
        "step_ms_median": round(step_ms, 2),
        "tok_s": round(args.batch * 1e3 / step_ms, 1),
        "page_faults_per_step": round(faults, 1),
        "wrapped_step_ms_median": round(wrapped_ms, 2),
        "wrapper_overhead_ms_est": round(wrapped_ms - step_ms, 2),
        "ms_per_step": parts,
        "share_of_wrapped_step": {k: round(v / wrapped_ms, 3) for k, v in parts.items()},
        "other_ms": round(wrapped_ms - covered, 2),
        "calls_per_step": calls // args.steps,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
