"""Structured-outputs micro-benchmark: what a constrained request costs the engine.

Over the default model's tokenizer (or --model), per backend (guidance; xgrammar when
installed and asked for):
  - backend build time (the tokenizer's trie / vocabulary tables, once per server);
  - compile time median for a small JSON schema (fresh compile each time, no cache);
  - matcher creation median (what a cache hit costs);
  - per-token fill_bitmask and accept medians along a valid instance's tokens (the work
    added to every decode step of a constrained sequence);
  - with --pathological, compile (or refusal) time of each pathological spec the tests cover.
Prints one JSON document; progress goes to stderr.

    python scripts/bench_structured.py [--repeats 20] [--backends guidance,xgrammar]
                                       [--pathological]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string", "maxLength": 40},
        "email": {"type": "string", "pattern": "^[a-z0-9.]+@[a-z0-9]+\\.[a-z]{2,4}$"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "active": {"type": "boolean"},
    },
    "required": ["id", "name", "email", "tags", "active"],
    "additionalProperties": False,
}
INSTANCE = {"id": 4217, "name": "Ada Lovelace", "email": "ada.lovelace@example.org",
            "tags": ["math", "engines", "poetry"], "active": True}


def log(msg: str) -> None:
    print(f"[bench_structured] {msg}", file=sys.stderr, flush=True)


def _ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1e3, 4)


def pathological_specs() -> dict[str, Any]:
    from actors.core.structured import StructuredSpec

    def nested(depth: int) -> dict[str, Any]:
        s: dict[str, Any] = {"type": "integer"}
        for _ in range(depth):
            s = {"type": "object", "properties": {"x": s}, "required": ["x"]}
        return s

    props = {f"p{i}": {"type": "integer"} for i in range(5000)}
    branches = [{"type": "object", "properties": {f"k{i}": {"type": "string"}},
                 "required": [f"k{i}"], "additionalProperties": False} for i in range(2000)]
    j = StructuredSpec.from_params
    return {
        "regex_(a+)+$": j(regex=r"(a+)+$"),
        "enum_10k": j(json={"enum": [f"value_{i}" for i in range(10_000)]}),
        "choice_10k": j(choice=[f"value_{i}" for i in range(10_000)]),
        "properties_5k_optional": j(json={"type": "object", "properties": props}),
        "properties_5k_required": j(json={"type": "object", "properties": props,
                                          "required": list(props)}),
        "nesting_200": j(json=nested(200)),
        "any_of_2k": j(json={"anyOf": branches}),
    }


def bench_backend(backend: Any, tokenizer: Any, repeats: int,
                  pathological: bool) -> dict[str, Any]:
    from actors.core.structured import GrammarCache, StructuredSpec
    from actors.errors import RequestRefused

    spec = StructuredSpec.from_params(json=SCHEMA, disable_any_whitespace=True)
    compiles: list[float] = []
    creates: list[float] = []
    fills: list[float] = []
    accepts: list[float] = []
    first_walk: list[float] = []
    grammar = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        grammar = backend.compile_grammar(spec)
        compiles.append(time.perf_counter() - t0)
    assert grammar is not None
    tokens = tokenizer.encode(json.dumps(INSTANCE, separators=(",", ":")),
                              add_special_tokens=False) + [backend.eos_token_ids[0]]
    row = np.zeros(backend.allocate_bitmask(1).shape[1], np.int32)
    for _ in range(repeats):
        t0 = time.perf_counter()
        m = grammar.matcher()
        creates.append(time.perf_counter() - t0)
        for t in tokens:
            t0 = time.perf_counter()
            m.fill_bitmask(row)
            t1 = time.perf_counter()
            ok = m.accept(t)
            t2 = time.perf_counter()
            if not ok:
                raise RuntimeError(f"{backend.name} refused token {t} of a valid instance")
            fills.append(t1 - t0)
            accepts.append(t2 - t1)
        if not m.is_terminated():
            raise RuntimeError(f"{backend.name} did not terminate on a valid instance")
        if not first_walk:  # later walks reuse lexer states the first one built
            first_walk = list(fills)
    out: dict[str, Any] = {
        "compile_ms_median": _ms(compiles),
        "compile_ms_first": round(compiles[0] * 1e3, 3),
        "matcher_create_ms_median": _ms(creates),
        "fill_bitmask_ms_median": _ms(fills),
        "fill_bitmask_ms_p90": round(float(np.percentile(fills, 90)) * 1e3, 4),
        "fill_bitmask_ms_median_first_walk": _ms(first_walk),
        "accept_ms_median": _ms(accepts),
        "tokens_per_walk": len(tokens),
    }
    if pathological:
        cases: dict[str, Any] = {}
        for name, pspec in pathological_specs().items():
            cache = GrammarCache(backend)
            t0 = time.perf_counter()
            try:
                cache.get(pspec)
                outcome = "compiled"
            except RequestRefused as e:
                outcome = f"refused: {e.message[:90]}"
            cases[name] = {"seconds": round(time.perf_counter() - t0, 3), "outcome": outcome}
            cache.close()
            log(f"{backend.name} {name}: {cases[name]}")
        out["pathological"] = cases
    return out


def run(tokenizer: Any, backends: list[str], repeats: int,
        pathological: bool = False) -> dict[str, Any]:
    from actors.core.structured import make_backend

    results: dict[str, Any] = {"schema_bytes": len(json.dumps(SCHEMA)),
                               "vocab_size": len(tokenizer), "repeats": repeats}
    for name in backends:
        t0 = time.perf_counter()
        try:
            backend = make_backend(name, tokenizer)
        except ValueError as e:
            results[name] = {"skipped": str(e)}
            log(f"{name}: skipped ({e})")
            continue
        build = time.perf_counter() - t0
        log(f"{name}: backend built in {build:.2f}s")
        results[name] = {"backend_build_s": round(build, 3),
                         **bench_backend(backend, tokenizer, repeats, pathological)}
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model directory or .gguf (default model)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--backends", default="guidance",
                    help="comma-separated: guidance, xgrammar")
    ap.add_argument("--pathological", action="store_true")
    args = ap.parse_args(argv)

    from actors.loader import prepare_model_dir
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(prepare_model_dir(args.model)[1]))
    out = run(tokenizer, [b.strip() for b in args.backends.split(",") if b.strip()],
              args.repeats, args.pathological)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
