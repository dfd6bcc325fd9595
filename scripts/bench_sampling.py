"""Sampling benchmark: llmcore's CPU sampler against the usual sort-based torch sampler.

Both sample with temperature 1, top-k 50 and top-p 0.9 over a 49152-token vocabulary and
report the logprob of the sampled token. The torch baseline is what most engines run:
softmax, a full descending sort, cumsum for top-p, a top-k mask, then multinomial.

    python scripts/bench_sampling.py [--quick]      # prints JSON; progress on stderr

``run(quick)`` returns the same dict, for scripts/bench_kernels.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import llmcore
from llmcore import sample

VOCAB = 49152
TOP_K = 50
TOP_P = 0.9
BATCHES = (1, 8, 64, 256)


def torch_sample(logits: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The sort-based reference: softmax + sort + cumsum top-p + top-k + multinomial."""
    logprobs = torch.log_softmax(logits, dim=-1)
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1]).expand_as(sorted_logits)
    sorted_logits = sorted_logits.masked_fill(ranks >= TOP_K, -torch.inf)
    probs = torch.softmax(sorted_logits, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill(before >= TOP_P, -torch.inf)
    picked = torch.multinomial(torch.softmax(sorted_logits, dim=-1), 1, generator=gen)
    tokens = order.gather(-1, picked).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm up (allocations, thread pool)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run(quick: bool = False) -> dict[str, Any]:
    """Times both samplers per batch size; returns medians in ms and torch / ours ratios."""
    repeats = 5 if quick else 20
    gen = torch.Generator().manual_seed(0)
    results = []
    for batch in BATCHES:
        logits = torch.randn(batch, VOCAB, generator=gen) * 3.0
        cols: dict[str, Any] = {
            "temperature": np.ones(batch, np.float32),
            "top_k": np.full(batch, TOP_K, np.int32),
            "top_p": np.full(batch, TOP_P, np.float32),
            "min_p": np.zeros(batch, np.float32),
            "repetition_penalty": np.ones(batch, np.float32),
            "presence_penalty": np.zeros(batch, np.float32),
            "frequency_penalty": np.zeros(batch, np.float32),
            "seed": np.arange(batch, dtype=np.uint64),
            "position": np.zeros(batch, np.int64),
        }
        ours = _median_ms(lambda: sample(logits, **cols), repeats)
        theirs = _median_ms(lambda: torch_sample(logits, gen), repeats)
        row = {"batch": batch, "llmcore_ms": round(ours, 4), "torch_ms": round(theirs, 4),
               "speedup": round(theirs / ours, 2)}
        print(f"bench_sampling: {row}", file=sys.stderr, flush=True)
        results.append(row)
    return {
        "vocab": VOCAB,
        "top_k": TOP_K,
        "top_p": TOP_P,
        "repeats": repeats,
        "threads": {"llmcore": llmcore.get_num_threads(), "torch": torch.get_num_threads()},
        "build_features": llmcore.build_features(),
        "results": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    args = parser.parse_args()
    print(json.dumps(run(quick=args.quick), indent=2))


if __name__ == "__main__":
    main()
