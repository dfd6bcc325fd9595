#!/usr/bin/env python
"""kv_sliding_bytes: the KV bytes one sequence holds with sliding-window KV freed (KV cache
groups, actors.core.kv_groups) against full attention's, printed as ONE JSON document.

Gemma 3 270M's shape by default: 18 layers of one KV head of 256, layers 5, 11, 17 full and
the other 15 with a window of 512, a bf16 cache, blocks of 16 tokens. A sequence runs
through the real KVManager over a real llmcore.BlockPool: its prompt in chunks of
--chunk tokens (the token budget), then decode steps up to --context tokens, freeing as
the engine does after each step. Reported per mode: the blocks held at the end, the most
held at any point (the peak is a prompt chunk's window), their bytes, and the bound the
scheduler's admission counts (KVGroups.max_blocks_per_seq). No timing: nothing here
depends on the machine.

    PYTHONPATH=python python scripts/kv_sliding_bytes.py > docs/bench/kv-sliding-gemma3.json
"""

from __future__ import annotations

import argparse
import json
import sys

import llmcore

from actors.core.kv_groups import KVGroups
from actors.core.kv_manager import KVManager
from actors.core.sequence import Sequence
from actors.params.sampling import SamplingParams


def gemma3_windows(num_layers: int, window: int, every: int) -> list[int | None]:
    """Every ``every``-th layer full (Gemma 3: the 6th, 12th, 18th), the others sliding."""
    return [None if (i + 1) % every == 0 else window for i in range(num_layers)]


def simulate(groups: KVGroups, block_size: int, context: int, prompt: int,
             chunk: int) -> dict[str, int]:
    """One sequence through the KV manager: its prompt in chunks, then decode steps."""
    need = groups.max_blocks_per_seq(context, chunk, block_size)
    kv = KVManager(llmcore.BlockPool(need, block_size), group_windows=groups.windows)
    seq = Sequence(0, "r", [1] * prompt, SamplingParams(max_tokens=context - prompt,
                                                        ignore_eos=True),
                   max_model_len=context + 1)
    peak = 0
    while seq.num_computed_tokens < context:
        n = min(chunk, seq.num_tokens - seq.num_computed_tokens)
        kv.allocate(seq, n)
        peak = max(peak, sum(kv.held_blocks(seq)))
        seq.num_computed_tokens += n
        kv.commit(seq)
        if seq.num_computed_tokens == seq.num_tokens and seq.num_tokens < context:
            seq.append_token(2)
    held = kv.held_blocks(seq)
    return {"blocks_held": sum(held), "blocks_held_per_group": held, "blocks_peak": peak,
            "blocks_bound": need}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=18)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--head-size", type=int, default=256)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--full-every", type=int, default=6, help="every n-th layer is full")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--context", type=int, default=8192, help="tokens at the end")
    ap.add_argument("--prompt", type=int, default=8000, help="prompt tokens (the rest decoded)")
    ap.add_argument("--chunk", type=int, default=2048, help="tokens per prefill step")
    ap.add_argument("--dtype-bytes", type=int, default=2, help="2: bf16 cache")
    a = ap.parse_args()

    windows = gemma3_windows(a.layers, a.window, a.full_every)
    per_layer_block = 2 * a.kv_heads * a.head_size * a.block_size * a.dtype_bytes  # K and V
    modes = {"freed": KVGroups.from_windows(windows), "full": KVGroups.single(a.layers)}
    report: dict = {
        "shape": {"layers": a.layers, "kv_heads": a.kv_heads, "head_size": a.head_size,
                  "window": a.window, "full_layers": [i for i, w in enumerate(windows)
                                                      if w is None],
                  "cache_dtype_bytes": a.dtype_bytes, "block_size": a.block_size},
        "context_tokens": a.context, "prompt_tokens": a.prompt, "prefill_chunk": a.chunk,
    }
    for name, groups in modes.items():
        r = simulate(groups, a.block_size, a.context, a.prompt, a.chunk)
        block_bytes = groups.num_slots * per_layer_block
        report[name] = {
            "groups": groups.num_groups, "layers_per_block": groups.num_slots,
            "bytes_per_block": block_bytes, **r,
            "bytes_held": r["blocks_held"] * block_bytes,
            "bytes_peak": r["blocks_peak"] * block_bytes,
            "bytes_bound": r["blocks_bound"] * block_bytes,
        }
    full_tokens = sum(w is None for w in windows) * a.context
    slide_tokens = sum(w is not None for w in windows) * min(a.window, a.context)
    report["ideal_bytes"] = (full_tokens + slide_tokens) * per_layer_block // a.block_size
    report["full_over_freed"] = round(report["full"]["bytes_held"]
                                      / report["freed"]["bytes_held"], 2)
    json.dump(report, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
