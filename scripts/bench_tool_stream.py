"""Tool-call streaming micro-benchmark: what each streamed token costs the tool-call parser.

For each parser (hermes, llama3_json, mistral, pythonic, and the forced-choice "required"
and named readers) one call whose arguments hold an array of k string items (k = 500 ..
8000, the shape `structured_outputs.regex` can force) is split into model-like tokens and
fed to a `ToolCallStream` token by token, each `feed` timed:

  - new_us_median: median microseconds per token over the whole call, token by token;
  - new_us_median_last / old_us_median_last: the median over the call's last --window
    tokens, for the stream as it is and for the full re-scan it replaced
    (tests/tool_scan_reference.py, the frozen former reading), measured alike in this run:
    the text before the window arrives in one feed, then each token of the window alone
    (the per-token cost depends only on the text so far, so this is what a token at that
    length cost; streaming the whole call through the re-scan takes minutes at k=8000);
  - flat_ratio: new_us_median at the largest k over the smallest (flat is about 1);
  - old_over_new: old_us_median_last / new_us_median_last per k.

Every streamed call is checked against the whole text parsed at once. Prints one JSON
document; progress goes to stderr.

    PYTHONPATH=python python scripts/bench_tool_stream.py [--ks 500,1000,2000,4000,8000]
        [--window 100] [--parsers hermes,pythonic] [--no-baseline]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the frozen former reading, the baseline

from server.frontend.chat.tool_parsers import ToolCallDelta, get_tool_parser
from server.frontend.chat.tool_parsers.base import ToolParser
from server.frontend.chat.tool_parsers.tool_schema import (
    NamedToolCallParser,
    RequiredToolCallParser,
)

# Word pieces, or up to two punctuation marks, each with the space before it: about the
# tokens a BPE vocabulary gives JSON (`{"`, `name`, `":`, ` "`, `""`, `,`, ` ""` ...).
_TOKEN = re.compile(r"\s?[A-Za-z0-9_]+|\s?[^\sA-Za-z0-9_]{1,2}|\s+")


def log(msg: str) -> None:
    print(f"[bench_tool_stream] {msg}", file=sys.stderr, flush=True)


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def call_text(parser_name: str, k: int) -> str:
    items = ", ".join(['""'] * k)
    arguments = '{"a": [' + items + "]}"
    if parser_name == "hermes":
        return '<tool_call>\n{"name": "f", "arguments": ' + arguments + "}\n</tool_call>"
    if parser_name == "llama3_json":
        return '{"name": "f", "parameters": ' + arguments + "}"
    if parser_name == "mistral":
        return '[TOOL_CALLS][{"name": "f", "arguments": ' + arguments + "}]"
    if parser_name == "pythonic":
        return "[f(a=[" + items + "])]"
    if parser_name == "required":
        return '[{"name": "f", "parameters": ' + arguments + "}]"
    if parser_name == "named":
        return arguments
    raise ValueError(parser_name)


def make_parser(parser_name: str) -> ToolParser:
    if parser_name == "required":
        return RequiredToolCallParser()
    if parser_name == "named":
        return NamedToolCallParser("f")
    return get_tool_parser(parser_name)()


def _us(samples: list[int]) -> float:
    return round(statistics.median(samples) / 1e3, 3)


def _check(parser: ToolParser, text: str, deltas: list[Any]) -> None:
    """The streamed call is the call parsed at once."""
    (expected,) = parser.parse(text).calls
    arguments = "".join(d.arguments for d in deltas if isinstance(d, ToolCallDelta))
    if json.loads(arguments) != json.loads(expected.arguments_json):
        raise AssertionError(f"{parser.name}: the streamed arguments differ from the parse")


def time_new(parser: ToolParser, tokens: list[str], window: int) -> tuple[float, float]:
    """(median per token over all tokens, median over the last `window`), microseconds."""
    stream = parser.new_stream()
    samples, deltas = [], []
    clock = time.perf_counter_ns
    for token in tokens:
        started = clock()
        out = stream.feed(token)
        samples.append(clock() - started)
        deltas += out
    deltas += stream.finish()
    _check(parser, "".join(tokens), deltas)
    return _us(samples), _us(samples[-window:])


def time_window(stream: Any, tokens: list[str], window: int) -> float:
    """Median microseconds per token over the last `window` tokens, the text before them
    fed at once."""
    stream.feed("".join(tokens[:-window]))
    samples = []
    clock = time.perf_counter_ns
    for token in tokens[-window:]:
        started = clock()
        stream.feed(token)
        samples.append(clock() - started)
    stream.finish()
    return _us(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ks", default="500,1000,2000,4000,8000")
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--parsers", default="hermes,llama3_json,mistral,pythonic,required,named")
    ap.add_argument("--no-baseline", action="store_true", help="skip the former re-scan")
    args = ap.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    names = args.parsers.split(",")
    reference = None
    if not args.no_baseline:
        import tool_scan_reference as reference

    results: dict[str, Any] = {}
    for name in names:
        row: dict[str, list[Any]] = {key: [] for key in (
            "k", "chars", "tokens", "new_us_median", "new_us_median_last",
            "old_us_median_last", "old_over_new")}
        for k in ks:
            text = call_text(name, k)
            tokens = _TOKEN.findall(text)
            assert "".join(tokens) == text
            parser = make_parser(name)
            new_all, _ = time_new(parser, tokens, args.window)
            # The window alone, as the baseline is timed (its own run: same state).
            new_last = time_window(parser.new_stream(), tokens, args.window)
            row["k"].append(k)
            row["chars"].append(len(text))
            row["tokens"].append(len(tokens))
            row["new_us_median"].append(new_all)
            row["new_us_median_last"].append(new_last)
            if reference is not None:
                old_last = time_window(reference.ReferenceStream(parser), tokens, args.window)
                row["old_us_median_last"].append(old_last)
                row["old_over_new"].append(round(old_last / new_last, 1))
            log(f"{name} k={k}: {len(tokens)} tokens, new {new_all} us/token "
                f"(last {args.window}: {new_last})"
                + (f", old {row['old_us_median_last'][-1]}" if reference else ""))
        row["flat_ratio"] = round(row["new_us_median"][-1] / row["new_us_median"][0], 2)
        row["flat_ratio_last"] = round(
            row["new_us_median_last"][-1] / row["new_us_median_last"][0], 2)
        if reference is not None:
            row["old_ratio_last"] = round(
                row["old_us_median_last"][-1] / row["old_us_median_last"][0], 1)
        results[name] = row

    print(json.dumps({
        "benchmark": "tool-call streaming, microseconds per fed token for one call of k "
                     "array items",
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "python": platform.python_version(),
        "window": args.window,
        "flat_ratio": {name: row["flat_ratio"] for name, row in results.items()},
        "old_over_new_at_largest_k": {
            name: row["old_over_new"][-1] for name, row in results.items()
            if row["old_over_new"]},
        "parsers": results,
        "command": "PYTHONPATH=python python scripts/bench_tool_stream.py "
                   + " ".join(sys.argv[1:]),
    }, indent=2))


if __name__ == "__main__":
    main()
