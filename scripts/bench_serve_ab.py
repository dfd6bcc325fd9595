"""Served throughput of two commits in one run: `python -m server` from each, alternated.

    python scripts/bench_serve_ab.py --base faa751f [--head HEAD] --concurrency 32 \
        --rounds 3 --requests 64 --max-tokens 64

Each side's Python sources are exported with `git archive` into a temporary folder and run
against the one compiled core of this checkout (the C++ core must be the same on both sides:
the script refuses commits whose csrc/ differs). Rounds alternate the order (A B, B A, ...)
so drift on a shared machine hits both sides alike. For each side and concurrency the
output is every round's scripts/bench_serve.py result, the median tokens/s, and the ratio
head/base of the medians; --offline adds the in-process engine of each side and the
served/offline ratio. Progress goes to stderr, the JSON to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_under_test import free_port, log

ROOT = Path(__file__).resolve().parent.parent

# Runs `python -m server` or a script from one exported tree: the editable install's finder
# is dropped so that the tree's own packages are imported, with the installed core module.
LAUNCH = """
import runpy, sys
sys.meta_path[:] = [f for f in sys.meta_path if 'ScikitBuild' not in type(f).__name__]
sys.path.insert(0, {tree!r})
mode, target = sys.argv[1], sys.argv[2]
sys.argv = [target] + sys.argv[3:]
runpy.run_module(target, run_name='__main__') if mode == 'module' else \\
    runpy.run_path(target, run_name='__main__')
"""


def export(ref: str, into: Path) -> Path:
    """The python/ and scripts/ folders of `ref` under `into`, with this checkout's core."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "python", "scripts"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    import llmcore._C as core

    so = Path(core.__file__)
    (into / "python" / "llmcore" / so.name).symlink_to(so)
    return into


def same_core(base: str, head: str) -> bool:
    diff = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", base, head, "--",
                           "csrc", "CMakeLists.txt"], check=False)
    return diff.returncode == 0


def launcher(tree: Path) -> list[str]:
    return [sys.executable, "-c", LAUNCH.format(tree=str(tree / "python"))]


def run_side(tree: Path, args, concurrency: int) -> dict:
    import httpx

    port = free_port()
    env = {**os.environ, "PYTHONPATH": ""}
    server = subprocess.Popen(
        launcher(tree) + ["module", "server", "--host", "127.0.0.1", "--port", str(port),
                          "--max-model-len", str(args.max_model_len),
                          "--kv-cache-memory", str(args.kv_cache_memory),
                          "--max-num-seqs", str(max(concurrency, 1))],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while True:
            if server.poll() is not None:
                raise SystemExit(f"server from {tree} exited with {server.returncode}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"server from {tree} not healthy after 300 s")
            time.sleep(0.2)
        cmd = launcher(tree) + ["path", str(tree / "scripts" / "bench_serve.py"),
                                "--url", url, "--concurrency", str(concurrency),
                                "--requests", str(args.requests),
                                "--max-tokens", str(args.max_tokens),
                                "--max-model-len", str(args.max_model_len),
                                "--kv-cache-memory", str(args.kv_cache_memory)]
        if args.offline:  # the same work on that tree's in-process engine, after the load
            cmd.append("--offline")
        out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                        env=env).stdout)
        result = out["served"][0]
        if args.offline:
            result["offline_tokens_per_s"] = out["offline"][0]["output_tokens_per_s"]
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the commit measured as the baseline")
    p.add_argument("--head", default="HEAD")
    p.add_argument("--concurrency", type=int, nargs="+", default=[32])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--kv-cache-memory", type=int, default=512 << 20)
    p.add_argument("--offline", action="store_true",
                   help="also the same work on each side's in-process engine, for the "
                        "served/offline ratio")
    p.add_argument("--allow-csrc-diff", action="store_true",
                   help="run although csrc/ differs (a change that moves or splits the core's "
                        "sources without changing what it computes): both sides still run on "
                        "this checkout's compiled core, and the record says so")
    args = p.parse_args()
    if not same_core(args.base, args.head) and not args.allow_csrc_diff:
        raise SystemExit("the two commits build different cores (csrc/ differs); this script "
                         "compares Python sides over one compiled core only")
    sides = {"base": args.base, "head": args.head}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {name: export(ref, Path(tmp) / name) for name, ref in sides.items()}
        runs: dict[str, dict[int, list[dict]]] = {n: {c: [] for c in args.concurrency}
                                                  for n in sides}
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for c in args.concurrency:
                for name in order:
                    log(f"round {r + 1}/{args.rounds}, concurrency {c}: {name} "
                        f"({sides[name]})")
                    res = run_side(trees[name], args, c)
                    log(f"  {res['output_tokens_per_s']} tok/s, {res['errors']} errors")
                    runs[name][c].append(res)
    out: dict = {"base": args.base, "head": args.head, "rounds": args.rounds, "levels": [],
                 "one_core": "this checkout's", "csrc_differs": not same_core(args.base,
                                                                              args.head)}
    for c in args.concurrency:
        level: dict = {"concurrency": c}
        for name in sides:
            rs = runs[name][c]
            level[name] = {
                "median_tokens_per_s": statistics.median(x["output_tokens_per_s"] for x in rs),
                "median_itl_p50": statistics.median(x["itl_p50"] for x in rs),
                "median_ttft_p50": statistics.median(x["ttft_p50"] for x in rs),
                "errors": sum(x["errors"] for x in rs),
                "runs": [x["output_tokens_per_s"] for x in rs],
            }
            offl = [x["offline_tokens_per_s"] for x in rs if "offline_tokens_per_s" in x]
            if offl:
                level[name]["median_offline_tokens_per_s"] = statistics.median(offl)
                level[name]["served_over_offline"] = round(
                    level[name]["median_tokens_per_s"] / statistics.median(offl), 3)
        level["head_over_base"] = round(level["head"]["median_tokens_per_s"]
                                        / level["base"]["median_tokens_per_s"], 3)
        out["levels"].append(level)
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
