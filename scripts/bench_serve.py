"""Load generator for any OpenAI-compatible server: streaming /v1/completions.

    python scripts/bench_serve.py --url http://127.0.0.1:8000 --concurrency 1 8 32 \
        --requests 64 --max-tokens 64 [--api-key K] [--offline]

For each concurrency level, `requests` streaming completions with ignore_eos run with that
many in flight; the result is JSON with TTFT and inter-token latency (p50/p99, seconds)
and output tokens per second. --offline also runs the same work on the in-process engine
(actors.llm) and reports served/offline throughput. --json-schema FILE constrains requests
by that schema (structured_outputs.json): each level then runs unconstrained and constrained
rounds alternately (--rounds of each) on the same server and reports the ratio of their
median throughputs, constrained/unconstrained. A schema whose shortest output is longer
than --max-tokens keeps every request generating to its limit, like ignore_eos does.
--prompt-tokens N gives every request its own prompt of about N tokens (distinct from its
first word, so no server's prefix cache serves one request from another's); without it every
request sends the one short PROMPT. A server that sends no usage chunk has its output tokens
counted as streamed text chunks (one token each on the servers this is run against).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import httpx
import trio

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
WORDS = ("the harbour light turned slowly over the water while the keeper wrote down every "
         "ship he saw and the weather of each night in a small book").split()


def prompts_of(tokens: int | None, count: int, first: int = 0) -> list[str]:
    """`count` prompts of about `tokens` tokens each (common English words are one token in
    the Llama-family vocabularies), each starting with its own number, from `first` on (a
    run that must not meet its own earlier prompts in a prefix cache starts past them);
    [PROMPT] when None."""
    if not tokens:
        return [PROMPT]
    return [f"Request {i}: " + " ".join(WORDS[(i + j) % len(WORDS)] for j in range(tokens - 4))
            for i in range(first, first + count)]


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


async def one(client: httpx.AsyncClient, args, ttfts, itls, counts, errors,
              schema=None, prompt: str = PROMPT) -> None:
    body = {"model": args.model, "prompt": prompt, "max_tokens": args.max_tokens,
            "stream": True, "ignore_eos": True, "temperature": 0.0,
            "stream_options": {"include_usage": True}}
    if schema is not None:
        body["structured_outputs"] = {"json": schema}
    start = time.perf_counter()
    last = None
    chunks, usage = 0, None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                errors.append(r.status_code)
                await r.aread()
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]["completion_tokens"]
                if not chunk.get("choices") or not chunk["choices"][0].get("text"):
                    continue
                chunks += 1
                now = time.perf_counter()
                if last is None:
                    ttfts.append(now - start)
                else:
                    itls.append(now - last)
                last = now
    except httpx.HTTPError as exc:
        errors.append(type(exc).__name__)
        return
    counts.append(usage if usage is not None else chunks)


async def level(args, concurrency: int, schema=None) -> dict:
    ttfts: list[float] = []
    itls: list[float] = []
    counts: list[int] = []
    errors: list = []
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=600,
                                 limits=limits) as client:
        sem = trio.Semaphore(concurrency)
        prompts = prompts_of(getattr(args, "prompt_tokens", None), args.requests,
                             getattr(args, "first_prompt", 0))

        async def guarded(i: int):
            async with sem:
                await one(client, args, ttfts, itls, counts, errors, schema,
                          prompts[i % len(prompts)])

        start = time.perf_counter()
        async with trio.open_nursery() as n:
            for i in range(args.requests):
                n.start_soon(guarded, i)
        elapsed = time.perf_counter() - start
    return {
        "concurrency": concurrency, "requests": args.requests, "errors": len(errors),
        "error_kinds": sorted({str(e) for e in errors}),
        "output_tokens": sum(counts), "seconds": round(elapsed, 3),
        "output_tokens_per_s": round(sum(counts) / elapsed, 2),
        "ttft_p50": pct(ttfts, 0.5), "ttft_p99": pct(ttfts, 0.99),
        "itl_p50": pct(itls, 0.5), "itl_p99": pct(itls, 0.99),
        "itl_mean": statistics.fmean(itls) if itls else None,
    }


def offline(args, concurrency: int) -> dict:
    # The same OpenMP setting `python -m server` uses (see server/__main__.py), set before
    # torch loads, so both sides of the ratio run the engine the same way.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from actors.core.engine import EngineConfig, LLMEngine
    from actors.params.sampling import SamplingParams

    engine = LLMEngine(EngineConfig(max_num_seqs=concurrency, max_model_len=args.max_model_len,
                                    kv_cache_memory=args.kv_cache_memory,
                                    quantization=args.quantization))
    prompts = [engine.tokenizer.encode(p)
               for p in prompts_of(args.prompt_tokens, args.requests)]
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, temperature=0.0)
    start = time.perf_counter()
    for i in range(args.requests):
        engine.add_request(f"r{i}", prompts[i % len(prompts)], params)
    tokens = 0
    while engine.has_unfinished_requests():
        tokens += sum(len(o.new_token_ids) for o in engine.step().outputs)
    elapsed = time.perf_counter() - start
    return {"concurrency": concurrency, "output_tokens": tokens,
            "output_tokens_per_s": round(tokens / elapsed, 2)}


def constrained_vs_plain(args) -> dict:
    with open(args.json_schema) as f:
        schema = json.load(f)
    trio.run(level, argparse.Namespace(**{**vars(args), "requests": 4}), 4, schema)  # warm
    out = {"schema": args.json_schema, "levels": []}
    for c in args.concurrency:
        plain, constrained = [], []
        for _ in range(args.rounds):
            plain.append(trio.run(level, args, c))
            constrained.append(trio.run(level, args, c, schema))
        med = [statistics.median(r["output_tokens_per_s"] for r in rs)
               for rs in (plain, constrained)]
        out["levels"].append({
            "concurrency": c, "unconstrained": plain, "constrained": constrained,
            "median_tokens_per_s": {"unconstrained": med[0], "constrained": med[1]},
            "constrained_over_unconstrained": round(med[1] / med[0], 3)})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=None,
                   help="a distinct prompt of about this many tokens per request")
    p.add_argument("--offline", action="store_true")
    p.add_argument("--quantization", default="auto", choices=["auto", "none", "gguf", "int8"],
                   help="offline engine: as the server's --quantization (auto, the server's "
                   "default, keeps the default model's GGUF blocks)")
    p.add_argument("--json-schema", default=None, metavar="FILE",
                   help="constrain requests by this JSON schema, alternated with "
                   "unconstrained rounds")
    p.add_argument("--rounds", type=int, default=3,
                   help="with --json-schema: rounds of each kind per level")
    p.add_argument("--max-model-len", type=int, default=1024,
                   help="offline engine: as the server's --max-model-len")
    p.add_argument("--kv-cache-memory", type=int, default=512 << 20,
                   help="offline engine: KV cache bytes, as the server's --kv-cache-memory")
    args = p.parse_args()
    if args.json_schema:
        json.dump(constrained_vs_plain(args), sys.stdout, indent=2)
        print()
        return 0
    results = {"served": [trio.run(level, args, c) for c in args.concurrency]}
    if args.offline:
        results["offline"] = [offline(args, c) for c in args.concurrency]
        results["served_over_offline"] = [
            round(s["output_tokens_per_s"] / o["output_tokens_per_s"], 3)
            for s, o in zip(results["served"], results["offline"])
        ]
    json.dump(results, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
