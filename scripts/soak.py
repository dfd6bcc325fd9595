"""Soak: N concurrent streaming requests for T minutes; errors, latency and the server's RSS.

    python scripts/soak.py --url http://127.0.0.1:8000 --pid PID [--concurrency 64 --minutes 10]
    python scripts/soak.py --start-server [--server-args "--kv-cache-memory 1g"]

Each of `concurrency` workers sends streaming requests back to back (completions and chat in
turn, distinct prompts, half of them behind a shared prefix, mixed lengths and sampling)
until `minutes` have passed; requests in flight then finish. A request counts as an error
unless it is answered 200, streams its chunks, ends every choice with a finish_reason other
than "abort" and ends with [DONE]. The server's RSS (from /proc/PID, the started server's or
--pid) is sampled every --sample-interval seconds; `flat` holds when the median of the last
window is within 5% of the median of the second (windows of a minute, or a third of the run
when it is shorter than three minutes: the first window is warm-up); without a PID there
is no RSS and no verdict on it. Afterwards
vllm:num_requests_running and vllm:num_requests_waiting must be back to 0.

One JSON document on stdout; progress on stderr; exit status 0 only when `ok`. Loopback
targets only.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field

import httpx
import trio
from server_under_test import ServerUnderTest, check_loopback, log, metric, rss_bytes

FLAT_TOLERANCE = 0.05
SHARED_PREFIX = ("You are a careful assistant. Answer in plain sentences, without lists, and "
                 "keep to the topic you are given. ")
TOPICS = ["lighthouses", "tides", "bread", "glaciers", "bees", "trains", "maps", "clocks",
          "rivers", "owls", "paper", "copper", "salt", "kites", "caves", "moss"]


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))], 4)


@dataclass
class Tally:
    served: int = 0
    output_chunks: int = 0
    ttft: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    examples: list[dict] = field(default_factory=list)

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if len(self.examples) < 10:
            self.examples.append({"kind": kind, "detail": detail[:300]})


def make_body(rng: random.Random, i: int, args) -> tuple[str, dict]:
    topic = rng.choice(TOPICS)
    text = f"Request {i}: write about {topic} and the number {rng.randrange(10**6)}."
    if rng.random() < 0.5:
        text = SHARED_PREFIX + text
    body: dict = {"max_tokens": rng.randint(max(1, args.max_tokens // 4), args.max_tokens),
                  "stream": True, "temperature": rng.choice([0.0, 0.7, 1.0]),
                  "ignore_eos": rng.random() < 0.5, "seed": rng.randrange(2**31)}
    if args.model:
        body["model"] = args.model
    if i % 2:
        body["messages"] = [{"role": "user", "content": text}]
        return "/v1/chat/completions", body
    body["prompt"] = text
    return "/v1/completions", body


def chunk_text(chunk: dict) -> str:
    choice = (chunk.get("choices") or [{}])[0]
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


async def one(client: httpx.AsyncClient, path: str, body: dict, tally: Tally,
              timeout: float) -> None:
    start = time.monotonic()
    first = None
    finish: dict[int, str | None] = {}
    done = False
    try:
        with trio.fail_after(timeout):
            async with client.stream("POST", path, json=body) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")
                    tally.error(f"http_{r.status_code}", text)
                    return
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        done = True
                        break
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        tally.error("stream_error_event", json.dumps(chunk))
                        return
                    for c in chunk.get("choices") or []:
                        if c.get("finish_reason") is not None or c["index"] not in finish:
                            finish[c["index"]] = c.get("finish_reason")
                    if first is None and chunk_text(chunk):
                        first = time.monotonic() - start
                    tally.output_chunks += 1
    except trio.TooSlowError:
        tally.error("timeout", f"{path} not finished in {timeout:.0f} s")
        return
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        tally.error(type(exc).__name__, f"{path}: {exc}")
        return
    reasons = set(finish.values())
    if not done:
        tally.error("no_done", f"{path}: the stream ended without [DONE]")
    elif not finish or None in reasons:
        tally.error("no_finish_reason", f"{path}: finish reasons {finish}")
    elif "abort" in reasons:
        tally.error("aborted", f"{path}: finish reasons {finish}")
    else:
        tally.served += 1
        tally.total.append(time.monotonic() - start)
        if first is not None:
            tally.ttft.append(first)


async def sample_rss(pid: int | None, interval: float, t0: float, samples: list,
                     stop: trio.Event) -> None:
    while pid is not None and not stop.is_set():
        rss = rss_bytes(pid)
        if rss is None:
            return
        samples.append((round(time.monotonic() - t0, 1), round(rss / 2**20, 1)))
        with trio.move_on_after(interval):
            await stop.wait()


def flat_verdict(samples: list, seconds: float) -> dict:
    window = min(60.0, seconds / 3)
    second = [r for t, r in samples if window <= t < 2 * window]
    last = [r for t, r in samples if t >= seconds - window]
    out: dict = {"window_s": round(window, 1), "second_window_median_mib": None,
                 "last_window_median_mib": None, "growth": None, "flat": None}
    if second and last:
        a, b = statistics.median(second), statistics.median(last)
        out.update(second_window_median_mib=round(a, 1), last_window_median_mib=round(b, 1),
                   growth=round(b / a - 1, 4), flat=abs(b / a - 1) <= FLAT_TOLERANCE)
    return out


async def settle(client: httpx.AsyncClient, timeout: float) -> dict:
    """Seconds until running and waiting are both 0 (None if not within `timeout`)."""
    t0 = time.monotonic()
    last = None
    while time.monotonic() - t0 < timeout:
        text = (await client.get("/metrics")).text
        last = {k: metric(text, f"vllm:{k}") for k in
                ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")}
        if last["num_requests_running"] == 0 and last["num_requests_waiting"] == 0:
            return {"idle_after_s": round(time.monotonic() - t0, 2), **last}
        await trio.sleep(0.1)
    return {"idle_after_s": None, **(last or {})}


async def soak(args, url: str, pid: int | None) -> dict:
    tally = Tally()
    rng = random.Random(args.seed)
    samples: list = []
    seconds = args.minutes * 60
    limits = httpx.Limits(max_connections=args.concurrency + 4)
    timeout = httpx.Timeout(args.request_timeout, connect=10)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits,
                                 headers={"Authorization": f"Bearer {args.api_key}"}
                                 if args.api_key else {}) as client:
        t0 = time.monotonic()
        deadline = t0 + seconds
        stop = trio.Event()
        counter = iter(range(args.max_requests))

        async def worker() -> None:
            while time.monotonic() < deadline:
                i = next(counter, None)
                if i is None:
                    return
                path, body = make_body(rng, i, args)
                await one(client, path, body, tally, args.request_timeout)

        async def progress() -> None:
            while not stop.is_set():
                with trio.move_on_after(args.progress_interval):
                    await stop.wait()
                rss = f"{samples[-1][1]} MiB" if samples else "n/a"
                log(f"soak {time.monotonic() - t0:6.0f} s: served {tally.served}, "
                    f"errors {sum(tally.errors.values())}, rss {rss}")

        async with trio.open_nursery() as bg:
            bg.start_soon(sample_rss, pid, args.sample_interval, t0, samples, stop)
            bg.start_soon(progress)
            async with trio.open_nursery() as workers:
                for _ in range(args.concurrency):
                    workers.start_soon(worker)
            elapsed = time.monotonic() - t0
            stop.set()
        settled = await settle(client, 5.0)
    rss = {"pid": pid, "interval_s": args.sample_interval, "samples": samples,
           **flat_verdict(samples, seconds)}
    return {
        "url": url, "concurrency": args.concurrency, "minutes": args.minutes,
        "seconds": round(elapsed, 1), "requests_served": tally.served,
        "errors": sum(tally.errors.values()), "error_kinds": tally.errors,
        "error_examples": tally.examples, "output_chunks": tally.output_chunks,
        "ttft_p50_s": pct(tally.ttft, 0.5), "ttft_p99_s": pct(tally.ttft, 0.99),
        "total_p50_s": pct(tally.total, 0.5), "total_p99_s": pct(tally.total, 0.99),
        "rss": rss, "after_load": settled,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--start-server", action="store_true",
                   help="launch `python -m server` on a free loopback port (ignores --url)")
    p.add_argument("--server-args", default="", help="extra arguments for the started server")
    p.add_argument("--pid", type=int, default=None, help="server PID for RSS (with --url)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-requests", type=int, default=1_000_000, help="a hard cap on requests")
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--sample-interval", type=float, default=5.0)
    p.add_argument("--progress-interval", type=float, default=30.0)
    p.add_argument("--model", default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    server = None
    try:
        if args.start_server:
            server = ServerUnderTest(shlex.split(args.server_args))
            log(f"starting the server on {server.url} (pid {server.pid})")
            server.wait_ready()
            url, pid = server.url, server.pid
        else:
            url, pid = check_loopback(args.url), args.pid
        log(f"soak: {args.concurrency} streams for {args.minutes} min against {url}")
        result = trio.run(soak, args, url, pid)
        if server is not None:
            result["server_exit_code"] = server.stop()
            if result["errors"] or result["server_exit_code"] != 0:
                result["server_log_tail"] = server.log_tail(2000)
    finally:
        if server is not None:
            server.close()
    result["ok"] = (result["errors"] == 0 and result["requests_served"] > 0
                    and result["rss"]["flat"] is not False
                    and result["after_load"]["idle_after_s"] is not None
                    and result.get("server_exit_code", 0) == 0)
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
