"""Bursts of streaming requests at an idle server: time to first token, against the time the
offline engine takes to prefill the same prompts.

    python scripts/bench_burst.py [--bursts 2 8 32] [--prompt-tokens 250] [--max-tokens 128]
        [--repeats 3] [--url http://127.0.0.1:8000]

Without --url it starts `python -m server` twice: once with --admission-window-ms 0 (every
step starts at once: the baseline) and once with the default admission window, and the two
take turns burst by burst (so a change in the machine's load falls on both); with --url it
measures that server only. A burst is
N streaming /v1/completions (distinct ~prompt-tokens prompts, ignore_eos, greedy) whose
bytes are written back to back on N connections opened beforehand (raw HTTP/1.1 through
h11, so that the client's own per-request cost does not spread the burst out); a request's
TTFT runs from the moment its bytes were written to its first chunk with text. Each burst
waits for the server to go idle first. From /metrics each burst also records how many
engine steps admitted its sequences (llmserve_step_admitted_sequences) and how many it
admitted.

The offline reference (actors.llm.LLM, the server's engine settings) adds the same N prompts
and steps until each has its first token: `offline_first_step_s` is one engine step
prefilling as many of them as max_num_batched_tokens holds (all of them up to 8 x 250
tokens), `offline_prefill_s` the steps until all had their first token. The ratio reported
is median TTFT / offline_prefill_s (1.0: the server added nothing to the engine's own work).
JSON on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from urllib.parse import urlsplit

import h11
import httpx
import trio

from bench_serve import prompts_of
from server_under_test import ServerUnderTest, check_loopback, log

METRIC = "llmserve_step_admitted_sequences"


class Streamed:
    """One streaming request on its own connection, its bytes prepared before the burst."""

    def __init__(self, host: str, port: int, body: dict) -> None:
        self.host, self.port = host, port
        self.conn = h11.Connection(h11.CLIENT)
        payload = json.dumps(body).encode()
        head = h11.Request(method="POST", target="/v1/completions", headers=[
            ("Host", f"{host}:{port}"), ("Content-Type", "application/json"),
            ("Content-Length", str(len(payload)))])
        self.data = (self.conn.send(head) + self.conn.send(h11.Data(data=payload))
                     + self.conn.send(h11.EndOfMessage()))
        self.stream: trio.SocketStream | None = None
        self.sent = self.first = 0.0
        self.status = 0

    async def connect(self) -> None:
        self.stream = await trio.open_tcp_stream(self.host, self.port)

    async def send(self) -> None:
        assert self.stream is not None
        self.sent = time.perf_counter()
        await self.stream.send_all(self.data)

    async def read(self) -> None:
        assert self.stream is not None
        buf = b""
        async with self.stream:
            while True:
                event = self.conn.next_event()
                if event is h11.NEED_DATA:
                    self.conn.receive_data(await self.stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    self.status = event.status_code
                elif isinstance(event, h11.Data):
                    buf += bytes(event.data)
                    while b"\n\n" in buf:
                        line, buf = buf.split(b"\n\n", 1)
                        self._event(line)
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    return

    def _event(self, line: bytes) -> None:
        if self.first or not line.startswith(b"data: {"):
            return
        choices = json.loads(line[6:]).get("choices") or []
        if choices and choices[0].get("text"):
            self.first = time.perf_counter()


def admitted(url: str) -> tuple[float, float]:
    """(steps that admitted sequences, sequences admitted) so far, over every label set."""
    count = total = 0.0
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(METRIC + "_count"):
            count += float(line.rsplit(" ", 1)[1])
        elif line.startswith(METRIC + "_sum"):
            total += float(line.rsplit(" ", 1)[1])
    return count, total


async def wait_idle(url: str) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        while (await client.get(url + "/load")).json().get("server_load", 0):
            await trio.sleep(0.05)
    await trio.sleep(0.3)  # the engine actor's last step and retirements


async def burst(url: str, prompts: list[str], max_tokens: int) -> dict:
    parts = urlsplit(url)
    reqs = [Streamed(parts.hostname or "127.0.0.1", parts.port or 80,
                     {"prompt": p, "max_tokens": max_tokens, "stream": True,
                      "ignore_eos": True, "temperature": 0.0}) for p in prompts]
    await wait_idle(url)
    steps, seqs = admitted(url)
    async with trio.open_nursery() as nursery:
        for r in reqs:
            nursery.start_soon(r.connect)
    async with trio.open_nursery() as nursery:
        for r in reqs:
            nursery.start_soon(r.read)
        for r in reqs:  # back to back: a few microseconds each on a fresh socket
            await r.send()
    bad = [r.status for r in reqs if r.status != 200 or not r.first]
    if bad:
        raise SystemExit(f"{len(bad)} requests of a burst of {len(reqs)} failed: {bad}")
    await wait_idle(url)
    after_steps, after_seqs = admitted(url)
    return {"ttft_ms": sorted(round((r.first - r.sent) * 1e3, 1) for r in reqs),
            "admitting_steps": int(after_steps - steps),
            "admitted_sequences": int(after_seqs - seqs)}


def measure(urls: dict[str, str], args) -> dict:
    """Every burst size on every server, the servers taking turns burst by burst (in
    alternating order), so that a change in the machine's load falls on all of them."""
    out: dict[str, dict] = {label: {} for label in urls}
    first = 10_000  # prompts never met before: no prefix-cache hits between bursts
    for url in urls.values():
        trio.run(burst, url, prompts_of(args.prompt_tokens, 2, first), 4)  # warm-up
        first += 2
    for n in args.bursts:
        runs: dict[str, list[dict]] = {label: [] for label in urls}
        for k in range(args.repeats):
            for label in (list(urls) if k % 2 == 0 else list(reversed(urls))):
                log(f"{label}: burst of {n} ({k + 1}/{args.repeats})")
                runs[label].append(trio.run(burst, urls[label],
                                            prompts_of(args.prompt_tokens, n, first),
                                            args.max_tokens))
                first += n
        for label, rs in runs.items():
            ttfts = [t for r in rs for t in r["ttft_ms"]]
            out[label][str(n)] = {"runs": rs, "ttft_median_ms": statistics.median(ttfts),
                                  "ttft_max_ms": max(ttfts)}
    return out


def offline(args) -> dict:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as python -m server sets it
    from actors.llm import LLM
    from actors.params.sampling import SamplingParams

    llm = LLM(max_model_len=args.max_model_len, kv_cache_memory=args.kv_cache_memory,
              max_num_batched_tokens=args.max_num_batched_tokens, quantization=args.quantization,
              linear_routing=args.linear_routing == "on")
    engine = llm.engine
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, temperature=0.0)
    out = {}
    first = 20_000
    for n, record in [(2, False), *((n, True) for n in args.bursts)]:  # warm up first
        times = []
        for _ in range(args.repeats):
            ids = [llm.tokenizer.encode(p) for p in prompts_of(args.prompt_tokens, n, first)]
            first += n
            for i, p in enumerate(ids):
                engine.add_request(f"b{first}-{i}", p, params)
            waiting = {f"b{first}-{i}" for i in range(n)}
            steps, start, step_s = 0, time.perf_counter(), []
            while waiting:
                t = time.perf_counter()
                batch = engine.step()
                step_s.append(time.perf_counter() - t)
                steps += 1
                waiting -= {o.request_id for o in batch.outputs if o.new_token_ids}
            times.append((step_s[0], time.perf_counter() - start, steps))
            for i in range(n):
                engine.abort_request(f"b{first}-{i}")
        if record:
            out[str(n)] = {
                "offline_first_step_s": round(statistics.median(t[0] for t in times), 4),
                "offline_prefill_s": round(statistics.median(t[1] for t in times), 4),
                "offline_prefill_steps": times[0][2]}
        log(f"offline: {n} prompts prefilled in {times[0][2]} steps, "
            f"{statistics.median(t[1] for t in times) * 1e3:.0f} ms")
    return out


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=None, help="a running server (loopback) to measure alone")
    p.add_argument("--bursts", type=int, nargs="+", default=[2, 8, 32])
    p.add_argument("--prompt-tokens", type=int, default=250)
    p.add_argument("--max-tokens", type=int, default=128,
                   help="tokens out per request (fewer: a shorter run, same TTFTs)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--kv-cache-memory", type=int, default=512 << 20)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--linear-routing", choices=["on", "off"], default="on",
                   help="of the servers started here and the offline engine (on: the "
                   "server's default; each process times its own table at load, which a busy "
                   "machine may tilt; off: one kernel per matrix everywhere)")
    p.add_argument("--quantization", default="auto", choices=["auto", "none", "gguf", "int8"],
                   help="of the servers started here and the offline engine (none: the "
                   "default model's matrices in bf16, the AMX kernel where the CPU has it)")
    p.add_argument("--no-offline", action="store_true", help="skip the offline reference")
    args = p.parse_args()
    result: dict = {
        "cpu": cpu_model(), "cpu_threads": len(os.sched_getaffinity(0)),
        "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
        "repeats": args.repeats, "max_num_batched_tokens": args.max_num_batched_tokens,
        "linear_routing": args.linear_routing, "quantization": args.quantization,
        "load_average_at_start": round(os.getloadavg()[0], 2),
    }
    from llmcore.isa import current

    result["isa"] = current()  # the kernels' instruction sets, the servers' too by default
    ref = {} if args.no_offline else offline(args)
    if ref:
        result["offline"] = ref
    if args.url:
        result["served"] = measure({"url": check_loopback(args.url)}, args)
    else:
        with contextlib.ExitStack() as stack:
            urls = {}
            for label, extra in (("window_off", ["--admission-window-ms", "0"]),
                                 ("window_on", [])):
                srv = ServerUnderTest([
                    "--max-model-len", str(args.max_model_len), "--kv-cache-memory",
                    str(args.kv_cache_memory), "--max-num-batched-tokens",
                    str(args.max_num_batched_tokens), "--linear-routing", args.linear_routing,
                    "--quantization", args.quantization,
                    *extra])
                stack.callback(srv.close)
                stack.callback(srv.stop)
                log(f"{label}: starting python -m server {' '.join(extra)}")
                srv.wait_ready()
                urls[label] = srv.url
                # The kernel each server routed each (shape, rows) to: a difference between
                # the two would tilt the comparison.
                result.setdefault("linear_routes", {})[label] = [
                    line.strip() for line in srv.log_tail(1 << 20).splitlines()
                    if line.startswith("  [")]
            result["served"] = measure(urls, args)
    result["load_average_at_end"] = round(os.getloadavg()[0], 2)
    for by_n in result["served"].values():
        for n, row in by_n.items():
            if n in ref:
                row["median_ttft_over_offline_prefill"] = round(
                    row["ttft_median_ms"] / 1e3 / ref[n]["offline_prefill_s"], 3)
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
