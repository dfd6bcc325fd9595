"""Chaos: clients that vanish, requests abandoned in the queue, SIGTERM under load.

    python scripts/chaos.py --start-server [--kills 1000 --abandon 1000]
    python scripts/chaos.py --url http://127.0.0.1:8000 [--kills 1000 --abandon 1000]

1. A greedy canary (completions, then the same again, which hits the prefix cache) and the
   idle values of /metrics.
2. `kills` streaming requests on raw sockets, each closed at a random point: with part of
   its body sent, just after the request, after 1-24 SSE events, or after a random delay;
   half with a TCP RST (SO_LINGER 0), half with a plain close.
3. Waves of streaming requests larger than the server's seats plus queue; after a moment
   every one that has received nothing yet (still queued or tokenizing) is closed, until
   `abandon` were; the running ones are closed too and 503s are counted.
4. Checks: vllm:num_requests_running and vllm:num_requests_waiting back to 0 within 2 s,
   vllm:kv_cache_usage_perc back to its idle value and /load back to 0 within 5 s, the
   server alive, no 5xx other than 503 seen, and the canary's output unchanged.
5. With --start-server: SIGTERM while streams, queued requests and non-streaming requests are
   in flight (and a few arrive after it): each must finish or be told why (an error event,
   finish_reason "abort", or an error status with a JSON body), and the exit code must be 0.
6. pooling-flood (only with --scenarios naming it): while a greedy canary stream runs,
   pooling requests over --max-pooling-inputs on every pooling route and list field (one
   more than the bound, and 200 000 one-character inputs) beside a few at the bound; each
   over-bound one must be a 400 naming its field within --flood-fast-s, the at-bound ones
   served whole, /health 200 throughout, and the stream's text and a pooling canary
   unchanged. Skipped, with a note, when the server has no pooling routes (with
   --start-server it gets --pooler-config).

7. operator-abandon (only with --scenarios naming it): every operator route (/pause and
   /sleep in wait mode, /wake_up, /is_paused, /reset_prefix_cache, /update_weights, the
   profiler, /collective_rpc...) called while a greedy stream runs, by a client that gives
   up after --operator-timeout-s (50 ms); --operator-rounds times each. Each stream must end
   whole ("length", then [DONE]), /health must stay 200, the server alive, and the canary
   unchanged. Skipped, with a note, when the server has no operator routes (with
   --start-server it gets --enable-dev-endpoints and a --profiler-config).

--scenarios picks the parts: kills and abandon (steps 1-4), sigterm (5, with
--start-server), pooling-flood (6), operator-abandon (7). Default: kills,abandon,sigterm.

One JSON document on stdout (exit status 0 only when `ok`); progress on stderr. Loopback
targets only; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shlex
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import trio
from raw_stream import RawStream
from server_under_test import ServerUnderTest, check_loopback, log, metric, rss_bytes

# Seats and queue small enough that 1000 abandoned requests take about a minute of waves.
DEFAULT_SERVER_ARGS = ["--max-num-seqs", "16", "--max-queued-requests", "32",
                       "--max-model-len", "1024", "--kv-cache-memory", "256m",
                       "--drain-timeout", "5"]
CANARY = {"prompt": "The capital of France is a city where", "max_tokens": 32,
          "temperature": 0.0}
SETTLE_S = 2.0  # running and waiting must be 0 this soon after the chaos stops
KV_SETTLE_S = 5.0
KILL_TIMEOUT_S = 60.0  # a kill task that sees nothing for this long counts as stuck
# Where a killed client stops (relative weights): with part of its body sent, just after
# sending the request, after 1-24 SSE events, after a random delay.
KILL_PLANS = {"partial_body": 1, "after_request": 1, "mid_stream": 6, "random_time": 2}
GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
SCENARIOS = ("kills", "abandon", "sigterm", "pooling-flood", "operator-abandon")
DEFAULT_SCENARIOS = "kills,abandon,sigterm"
# pooling-flood: the pooler a started server gets, the canaries, the huge request's size
FLOOD_POOLER = '{"pooling_type": "MEAN"}'
POOLING_CANARY = "A canary sentence about the sea."
FLOOD_HUGE_INPUTS = 200_000  # one-character inputs: ~800 kB, under the 4 MB body limit
# operator-abandon: (method, path, body, (state route, key, value, undo route) or None)
OPERATOR_CALLS = [
    ("POST", "/pause?mode=wait", None, ("/is_paused", "is_paused", True, "/resume")),
    ("GET", "/is_paused", None, None),
    ("POST", "/reset_prefix_cache", None, None),
    ("POST", "/sleep?mode=wait&level=1", None,
     ("/is_sleeping", "is_sleeping", True, "/wake_up")),
    ("POST", "/wake_up", None, None),
    ("GET", "/is_sleeping", None, None),
    ("GET", "/weight_info", None, None),
    ("POST", "/collective_rpc", {"method": "reset_prefix_cache"}, None),
    ("POST", "/update_weights", {"update_info": {"path": "/nonexistent.safetensors"}}, None),
    ("POST", "/start_profile", None, None),
    ("POST", "/stop_profile", None, None),
    ("POST", "/abort_requests", {"request_ids": ["no-such-request"]}, None),
]
# (route, the field over the bound, the body for a list of inputs)
FLOOD_ROUTES = (
    ("/v1/embeddings", "input", lambda items: {"input": items}),
    ("/v1/embeddings", "input", lambda items: {"input": [[1000 + len(t)] for t in items]}),
    ("/pooling", "input", lambda items: {"input": items}),
    ("/v2/embed", "texts", lambda items: {"texts": items}),
    ("/v1/score", "text_2", lambda items: {"text_1": "query", "text_2": items}),
    ("/score", "documents", lambda items: {"queries": "query", "documents": items}),
    ("/rerank", "documents", lambda items: {"query": "query", "documents": items}),
    ("/v1/rerank", "documents", lambda items: {"query": "query", "documents": items}),
    ("/v2/rerank", "documents", lambda items: {"query": "query", "documents": items}),
)


@dataclass
class Tally:
    counts: dict[str, int] = field(default_factory=dict)
    server_errors: list[str] = field(default_factory=list)  # 5xx other than 503

    def add(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def status(self, code: int | None, where: str) -> None:
        if code is not None and code >= 500 and code != 503 and len(self.server_errors) < 20:
            self.server_errors.append(f"{where}: HTTP {code}")


def stream_body(rng: random.Random, i: int, model: str | None,
                chat: bool | None = None) -> tuple[str, dict]:
    """A streaming completions or chat body (chat=None: either, at random)."""
    text = f"Story {i} about {rng.choice(['a fox', 'a ship', 'a bell', 'rain'])}: once,"
    body: dict = {"stream": True, "max_tokens": rng.randint(24, 96), "ignore_eos": True,
                  "temperature": rng.choice([0.0, 0.8])}
    if model:
        body["model"] = model
    if chat if chat is not None else rng.random() < 0.5:
        body["messages"] = [{"role": "user", "content": text}]
        return "/v1/chat/completions", body
    body["prompt"] = text
    return "/v1/completions", body


async def kill_one(i: int, rng: random.Random, host: str, port: int, args,
                   tally: Tally) -> None:
    path, body = stream_body(rng, i, args.model)
    plans = [p for p in KILL_PLANS if p in args.kill_plans]
    plan = rng.choices(plans, weights=[KILL_PLANS[p] for p in plans])[0]
    rst = {"rst": True, "fin": False}.get(args.close, rng.random() < 0.5)
    raw = RawStream(host, port, args.api_key)
    head, payload = raw.request_bytes(path, body)
    with trio.move_on_after(KILL_TIMEOUT_S) as scope:
        try:
            await raw.connect()
            if plan == "partial_body":
                await raw.send(head + payload[: rng.randrange(len(payload))])
                await trio.sleep(rng.uniform(0, 0.05))
            else:
                await raw.send(head + payload)
                if plan == "after_request":
                    await trio.sleep(rng.uniform(0, 0.02))
                elif plan == "mid_stream":
                    await raw.read_until(rng.randint(1, 24))
                else:
                    with trio.move_on_after(rng.uniform(0, 1.5)):
                        while not raw.eof:
                            await raw.read_some()
        except OSError as exc:
            tally.add(f"oserror_{type(exc).__name__}")
    if scope.cancelled_caught:
        tally.add("stuck")
    await raw.close(rst)
    tally.add(f"{plan}_{'rst' if rst else 'fin'}")
    tally.status(raw.status, f"kill {i} ({plan})")
    if raw.status is not None:
        tally.add(f"status_{raw.status}")


async def kills(args, host: str, port: int, concurrency: int) -> dict:
    tally = Tally()
    rng = random.Random(args.seed)
    limiter = trio.CapacityLimiter(concurrency)
    t0 = time.monotonic()
    done = 0

    async def guarded(i: int) -> None:
        nonlocal done
        async with limiter:
            await kill_one(i, random.Random(rng.random()), host, port, args, tally)
        done += 1
        if done % max(1, args.kills // 10) == 0:
            log(f"kills: {done}/{args.kills}")

    async with trio.open_nursery() as n:
        for i in range(args.kills):
            n.start_soon(guarded, i)
    return {"requests": args.kills, "concurrency": concurrency,
            "seconds": round(time.monotonic() - t0, 1), "by_kind": dict(sorted(
                tally.counts.items())), "server_errors": tally.server_errors}


async def abandon_waves(args, client: httpx.AsyncClient, host: str, port: int,
                        seats: int, capacity: int) -> dict:
    tally = Tally()
    rng = random.Random(args.seed + 1)
    wave_size = capacity + seats  # more than fit: some get 503 at once
    per_wave = max(1, capacity - seats)
    max_waves = 3 * math.ceil(args.abandon / per_wave) + 3
    abandoned = waves = 0
    max_waiting = 0.0
    t0 = time.monotonic()
    while abandoned < args.abandon and waves < max_waves:
        waves += 1
        streams = [RawStream(host, port, args.api_key) for _ in range(wave_size)]

        async def run(raw: RawStream, i: int) -> None:
            # Completions only: a chat stream sends its role chunk before its first token,
            # so "nothing received yet" would not tell a queued chat request apart.
            path, body = stream_body(rng, i, args.model, chat=False)
            body["max_tokens"] = 128
            head, payload = raw.request_bytes(path, body)
            try:
                await raw.connect()
                await raw.send(head + payload)
                while not raw.eof and raw.events == 0:
                    await raw.read_some()
            except OSError:
                tally.add("oserror")

        with trio.move_on_after(args.hold):
            async with trio.open_nursery() as n:
                for i, raw in enumerate(streams):
                    n.start_soon(run, raw, waves * wave_size + i)

                async def watch() -> None:
                    nonlocal max_waiting
                    while True:
                        text = (await client.get("/metrics")).text
                        max_waiting = max(max_waiting,
                                          metric(text, "vllm:num_requests_waiting") or 0)
                        await trio.sleep(0.1)

                n.start_soon(watch)
        for raw in streams:
            tally.status(raw.status, f"wave {waves}")
            if raw.status == 503:
                tally.add("refused_503")
            elif raw.events == 0 and not raw.eof and abandoned < args.abandon:
                abandoned += 1
                tally.add("abandoned_queued")
            else:
                tally.add("closed_running" if raw.events else "closed_other")
            await raw.close(rng.random() < 0.5)
        if waves % 5 == 0:
            log(f"abandon: wave {waves}, {abandoned}/{args.abandon} abandoned while queued")
    return {"abandoned_while_queued": abandoned, "target": args.abandon, "waves": waves,
            "wave_size": wave_size, "max_waiting_seen": max_waiting,
            "seconds": round(time.monotonic() - t0, 1),
            "by_kind": dict(sorted(tally.counts.items())), "server_errors": tally.server_errors}


async def gauges(client: httpx.AsyncClient) -> dict:
    text = (await client.get("/metrics")).text
    out = {k: metric(text, f"vllm:{k}") for k in GAUGES}
    out["metric_events_dropped"] = metric(text, "llmserve_metric_events_dropped_total")
    out["load"] = (await client.get("/load")).json().get("server_load")
    return out


async def settle(client: httpx.AsyncClient, idle: dict) -> dict:
    t0 = time.monotonic()
    first_zero = kv_idle = load_zero = None
    last = {}
    while time.monotonic() - t0 < KV_SETTLE_S:
        last = await gauges(client)
        now = round(time.monotonic() - t0, 2)
        if first_zero is None and last["num_requests_running"] == 0 \
                and last["num_requests_waiting"] == 0:
            first_zero = now
        if kv_idle is None and last["kv_cache_usage_perc"] == idle["kv_cache_usage_perc"]:
            kv_idle = now
        if load_zero is None and last["load"] == 0:
            load_zero = now
        if None not in (first_zero, kv_idle, load_zero):
            break
        await trio.sleep(0.05)
    return {"running_waiting_zero_after_s": first_zero, "kv_idle_after_s": kv_idle,
            "load_zero_after_s": load_zero, "last": last,
            "ok": first_zero is not None and first_zero <= SETTLE_S
            and kv_idle is not None and load_zero is not None}


async def canary(client: httpx.AsyncClient, model: str | None) -> str | None:
    body = dict(CANARY, **({"model": model} if model else {}))
    r = await client.post("/v1/completions", json=body)
    if r.status_code != 200:
        return None
    return r.json()["choices"][0]["text"]


async def sigterm_under_load(args, server: ServerUnderTest, seats: int) -> dict:
    """Streams, queued streams and whole responses in flight when SIGTERM arrives."""
    outcomes: dict[str, int] = {}
    broken: list[str] = []

    def note(kind: str, detail: str | None = None) -> None:
        outcomes[kind] = outcomes.get(kind, 0) + 1
        if detail is not None and len(broken) < 20:
            broken.append(detail[:300])

    rng = random.Random(args.seed + 2)
    started = trio.Event()
    first_tokens = 0
    n_stream = seats + seats // 2

    async def streaming(client: httpx.AsyncClient, i: int) -> None:
        nonlocal first_tokens
        path, body = stream_body(rng, i, args.model)
        body["max_tokens"] = 400 if i % 2 else 16  # some finish within the drain, some not
        finish: dict[int, str | None] = {}
        seen_token = False
        try:
            async with client.stream("POST", path, json=body) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")
                    ok = text.startswith("{") and "error" in json.loads(text)
                    note(f"status_{r.status_code}" if ok else "status_without_error_body",
                         None if ok else f"{path}: {r.status_code} {text}")
                    return
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        reasons = set(finish.values())
                        if not finish or None in reasons:
                            note("done_without_finish_reason", f"{path}: {finish}")
                        else:
                            note("aborted_told" if "abort" in reasons else "completed")
                        return
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        note("error_event")
                        return
                    for c in chunk.get("choices") or []:
                        if c.get("finish_reason") is not None or c["index"] not in finish:
                            finish[c["index"]] = c.get("finish_reason")
                    if not seen_token:
                        seen_token = True
                        first_tokens += 1
                        if first_tokens >= seats // 2:
                            started.set()
            note("ended_without_done", f"{path}: no [DONE], finish reasons {finish}")
        except httpx.HTTPError as exc:
            note("broken", f"{path}: {type(exc).__name__}: {exc}")

    async def whole(client: httpx.AsyncClient, i: int) -> None:
        body = {"prompt": f"Whole response {i}:", "max_tokens": 400, "ignore_eos": True}
        try:
            r = await client.post("/v1/completions", json=body)
            data = r.json()
            if r.status_code == 200 and data["choices"][0].get("finish_reason"):
                note("whole_" + data["choices"][0]["finish_reason"])
            elif r.status_code != 200 and "error" in data:
                note(f"whole_status_{r.status_code}")
            else:
                note("whole_untold", f"whole: {r.status_code} {r.text}")
        except (httpx.HTTPError, ValueError) as exc:
            note("whole_broken", f"whole: {type(exc).__name__}: {exc}")

    async def late(client: httpx.AsyncClient, i: int) -> None:
        try:
            r = await client.post("/v1/completions", json={"prompt": "late", "max_tokens": 4})
            note(f"late_status_{r.status_code}")
        except httpx.ConnectError:
            note("late_refused")  # the listener is closed: also an answer
        except httpx.HTTPError as exc:
            note("late_broken", f"late: {type(exc).__name__}: {exc}")

    limits = httpx.Limits(max_connections=4 * seats + 16)
    rss_before = rss_bytes(server.pid)
    t_signal = None
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits,
                                 headers=headers) as client:
        async with trio.open_nursery() as n:
            for i in range(n_stream):
                n.start_soon(streaming, client, i)
            for i in range(4):
                n.start_soon(whole, client, i)
            with trio.move_on_after(30):
                await started.wait()
            t_signal = time.monotonic()
            log(f"sigterm: {first_tokens} of {n_stream} streams started; sending SIGTERM")
            server.terminate()
            await trio.sleep(0.2)
            for i in range(4):
                n.start_soon(late, client, i)
    exit_code = await trio.to_thread.run_sync(server.wait, 60.0)
    bad = {"broken", "ended_without_done", "done_without_finish_reason",
           "status_without_error_body", "whole_untold", "whole_broken", "late_broken"}
    return {"streams": n_stream, "whole": 4, "late": 4, "outcomes": dict(sorted(outcomes.items())),
            "untold": broken, "exit_code": exit_code,
            "exit_after_s": round(time.monotonic() - t_signal, 2) if t_signal else None,
            "rss_mib_before": round(rss_before / 2**20, 1) if rss_before else None,
            "ok": exit_code == 0 and not (bad & set(outcomes))}


async def pooling_flood(args, client: httpx.AsyncClient, cfg: dict) -> dict:
    """Scenario 6 (see the module's docstring); one JSON object, with `ok`."""
    model = {"model": args.model} if args.model else {}
    probe = await client.post("/v1/embeddings", json={"input": POOLING_CANARY, **model})
    if probe.status_code == 404:
        return {"skipped": "the server has no pooling routes (serve a pooling model, or "
                           "a generative one with --pooler-config)", "ok": True}
    if probe.status_code != 200:
        return {"ok": False, "error": f"pooling canary: HTTP {probe.status_code} "
                                      f"{probe.text[:300]}"}
    canary_vec = probe.json()["data"][0]["embedding"]
    bound = int(cfg.get("max_pooling_inputs") or args.pooling_bound)
    max_body = int(cfg.get("max_body_bytes") or 4 << 20)
    huge = max(bound + 1, min(FLOOD_HUGE_INPUTS, (max_body - 4096) // 8))
    stream_body = dict(CANARY, max_tokens=args.flood_stream_tokens, **model)
    reference = await client.post("/v1/completions", json=stream_body)
    stream_ref = (reference.json()["choices"][0]["text"]
                  if reference.status_code == 200 else None)

    over: list[dict] = []
    at_bound: list[dict] = []
    health: list[tuple[int, float]] = []
    stream: dict = {"text": "", "events": 0, "max_gap_s": 0.0}
    streaming = trio.Event()
    flooding_done = trio.Event()

    async def over_one(i: int) -> None:
        path, field, body = FLOOD_ROUTES[i % len(FLOOD_ROUTES)]
        n = bound + 1 if i % 2 == 0 else huge
        row: dict = {"path": path, "field": field, "inputs": n}
        t0 = time.monotonic()
        try:
            r = await client.post(path, json={**body(["a"] * n), **model})
            err = r.json().get("error") if r.headers.get("content-type", "").startswith(
                "application/json") else None
            row.update(status=r.status_code, param=(err or {}).get("param"),
                       envelope=isinstance(err, dict) and "message" in err)
        except httpx.HTTPError as exc:
            row.update(status=None, error=f"{type(exc).__name__}: {exc}"[:200])
        over.append(dict(row, s=round(time.monotonic() - t0, 3)))

    async def at_bound_one(i: int) -> None:
        texts = [chr(ord("a") + (i + k) % 26) for k in range(bound)]  # a token or two each
        t0 = time.monotonic()
        try:
            r = await client.post("/v1/embeddings", json={"input": texts, **model},
                                  timeout=args.flood_at_timeout)
            row = {"status": r.status_code,
                   "vectors": len(r.json()["data"]) if r.status_code == 200 else None}
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            row = {"status": None, "error": f"{type(exc).__name__}: {exc}"[:200]}
        at_bound.append(dict(row, s=round(time.monotonic() - t0, 3)))

    async def canary_stream() -> None:
        try:
            async with client.stream("POST", "/v1/completions",
                                     json=dict(stream_body, stream=True)) as r:
                stream["status"] = r.status_code
                last = time.monotonic()
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    now = time.monotonic()
                    stream["max_gap_s"] = round(max(stream["max_gap_s"], now - last), 3)
                    last = now
                    for c in json.loads(line[6:]).get("choices") or []:
                        stream["text"] += c.get("text") or ""
                        stream["finish_reason"] = c.get("finish_reason") or \
                            stream.get("finish_reason")
                    stream["events"] += 1
                    streaming.set()
        except httpx.HTTPError as exc:
            stream["error"] = f"{type(exc).__name__}: {exc}"[:200]
        finally:
            streaming.set()

    async def poll_health() -> None:
        while not flooding_done.is_set():
            t0 = time.monotonic()
            try:
                code = (await client.get("/health", timeout=10)).status_code
            except httpx.HTTPError:
                code = 0
            health.append((code, time.monotonic() - t0))
            await trio.sleep(0.05)

    t_start = time.monotonic()
    async with trio.open_nursery() as n:
        n.start_soon(poll_health)
        if stream_ref is not None:
            n.start_soon(canary_stream)
            with trio.move_on_after(30):
                await streaming.wait()
        async with trio.open_nursery() as flood:
            for i in range(args.flood_at):
                flood.start_soon(at_bound_one, i)
            for i in range(args.flood_over):
                flood.start_soon(over_one, i)
        flooding_done.set()
    seconds = round(time.monotonic() - t_start, 2)

    after = await client.post("/v1/embeddings", json={"input": POOLING_CANARY, **model})
    after_vec = after.json()["data"][0]["embedding"] if after.status_code == 200 else None
    idle_after = None
    if stream_ref is not None:  # the same greedy request, alone again
        again = await client.post("/v1/completions", json=stream_body)
        idle_after = again.json()["choices"][0]["text"] if again.status_code == 200 else None
    diff = (max(abs(a - b) for a, b in zip(canary_vec, after_vec))
            if after_vec is not None and len(after_vec) == len(canary_vec) else None)

    def counts(rows: list[dict]) -> dict[str, int]:
        return dict(sorted(Counter(str(row["status"]) for row in rows).items()))

    over_times = sorted(row["s"] for row in over)
    checks = {
        "over_bound_400_naming_the_field": len(over) == args.flood_over and all(
            row["status"] == 400 and row["envelope"] and row["param"] == row["field"]
            for row in over),
        "over_bound_fast": not over_times or over_times[-1] <= args.flood_fast_s,
        "at_bound_served": len(at_bound) == args.flood_at and all(
            row["status"] == 200 and row["vectors"] == bound for row in at_bound),
        "health_200": bool(health) and all(code == 200 for code, _ in health),
        "pooling_canary_unchanged": diff is not None and diff <= 1e-6,
    }
    if stream_ref is not None:
        # The stream ran beside the flood: it must end whole. Its text equals the idle one
        # only where a row's tokens do not depend on the batch (the default; not with
        # --no-batch-invariant), so that is reported, not checked; the same request alone
        # afterwards must match.
        checks["canary_stream_completed"] = stream.get("status") == 200 \
            and stream["events"] > 0 and stream.get("finish_reason") in ("stop", "length") \
            and "error" not in stream
        checks["canary_unchanged"] = idle_after == stream_ref
    return {
        "bound": bound, "huge_inputs": huge, "seconds": seconds,
        "over_bound": {"requests": len(over), "statuses": counts(over),
                       "max_s": over_times[-1] if over_times else None,
                       "median_s": over_times[len(over_times) // 2] if over_times else None,
                       "wrong": [row for row in over if row["status"] != 400
                                 or row["param"] != row["field"]][:10]},
        "at_bound": {"requests": len(at_bound), "statuses": counts(at_bound),
                     "max_s": max((row.get("s", 0) for row in at_bound), default=None)},
        "health": {"polls": len(health), "non_200": sum(c != 200 for c, _ in health),
                   "max_s": round(max((t for _, t in health), default=0.0), 3)},
        "canary_stream": ({"skipped": "the server serves no completions"}
                          if stream_ref is None else
                          {"events": stream["events"], "max_gap_s": stream["max_gap_s"],
                           "finish_reason": stream.get("finish_reason"),
                           "same_text_as_alone": stream["text"] == stream_ref,
                           "unchanged_after": checks["canary_unchanged"],
                           **({"error": stream["error"]} if "error" in stream else {})}),
        "pooling_canary": {"max_abs_diff": diff,
                           "unchanged": checks["pooling_canary_unchanged"]},
        "checks": checks, "ok": all(checks.values()),
    }


async def operator_abandon(args, client: httpx.AsyncClient, server: ServerUnderTest | None
                           ) -> dict:
    """Scenario 7 (see the module's docstring); one JSON object, with `ok`."""
    model = {"model": args.model} if args.model else {}
    probe = await client.get("/is_paused")
    if probe.status_code == 404:
        return {"skipped": "the server has no operator routes (--enable-dev-endpoints)",
                "ok": True}
    before = await canary(client, args.model)
    body = dict(CANARY, max_tokens=args.operator_stream_tokens, ignore_eos=True, stream=True,
                **model)
    routes: dict[str, dict] = {}
    streams_whole = streams = 0
    health_codes: list[int] = []
    for _round in range(args.operator_rounds):
        for method, path, payload, undo in OPERATOR_CALLS:
            row = routes.setdefault(path, {"abandoned": 0, "answered": 0, "statuses": []})
            finish, done, events = None, False, 0
            async with client.stream("POST", "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: "):
                        events += 1
                        chunk = json.loads(line[6:])
                        if chunk.get("choices") and chunk["choices"][0].get("finish_reason"):
                            finish = chunk["choices"][0]["finish_reason"]
                        if events == 3:
                            try:
                                answer = await client.request(
                                    method, path, json=payload,
                                    timeout=args.operator_timeout_s)
                                row["answered"] += 1
                                row["statuses"].append(answer.status_code)
                            except httpx.TimeoutException:
                                row["abandoned"] += 1
            streams += 1
            streams_whole += int(r.status_code == 200 and finish == "length" and done)
            if undo is not None:  # the abandoned pause or sleep applies once drained
                state_path, key, value, undo_path = undo
                with trio.move_on_after(30):
                    while (await client.get(state_path)).json().get(key) != value:
                        await trio.sleep(0.05)
                await client.post(undo_path)
            health_codes.append((await client.get("/health")).status_code)
    # Whatever profiling session a round left open is closed (a 409 when none is).
    await client.post("/stop_profile")
    after = await canary(client, args.model)
    alive = (server is None or server.proc.poll() is None) and \
        (await client.get("/health")).status_code == 200
    for row in routes.values():
        row["statuses"] = sorted(set(row["statuses"]))
    checks = {"streams_whole": streams_whole == streams,
              "health_200": set(health_codes) == {200}, "alive": alive,
              "canary_unchanged": before is not None and after == before,
              "drain_calls_abandoned": all(routes[p]["abandoned"] > 0 for p in
                                           ("/pause?mode=wait", "/sleep?mode=wait&level=1"))}
    return {"timeout_s": args.operator_timeout_s, "rounds": args.operator_rounds,
            "streams": streams, "streams_whole": streams_whole, "routes": routes,
            "canary": {"before": before, "after": after}, "checks": checks,
            "ok": all(checks.values())}


async def kills_and_abandon(args, client: httpx.AsyncClient, host: str, port: int,
                            seats: int, capacity: int, server: ServerUnderTest | None,
                            pid: int | None) -> dict:
    """Steps 1-4 (see the module's docstring), those --scenarios names, between two canaries
    and two RSS readings."""
    out: dict = {}
    before = await canary(client, args.model)
    before_cached = await canary(client, args.model)
    idle = await gauges(client)
    rss0 = rss_bytes(pid) if pid else None
    out["idle"] = idle
    log(f"idle: {idle}; canary {before!r}")

    if "kills" in args.scenarios:
        log(f"kills: {args.kills} clients closed mid-request")
        out["kills"] = await kills(args, host, port, args.kill_concurrency or seats)
        out["settle_after_kills"] = await settle(client, idle)
        log(f"after kills: {out['settle_after_kills']}")

    if "abandon" in args.scenarios:
        log(f"abandon: {args.abandon} requests closed while queued")
        out["abandon"] = await abandon_waves(args, client, host, port, seats, capacity)
        out["settle_after_abandon"] = await settle(client, idle)
        log(f"after abandon: {out['settle_after_abandon']}")

    alive = (server is None or server.proc.poll() is None) and \
        (await client.get("/health")).status_code == 200
    after = await canary(client, args.model)
    rss1 = rss_bytes(pid) if pid else None
    out["canary"] = {"before": before, "before_cached": before_cached, "after": after,
                     "stable_before": before == before_cached,
                     "unchanged": before is not None and after == before}
    out["alive"] = alive
    out["rss_mib"] = {"before": round(rss0 / 2**20, 1) if rss0 else None,
                      "after": round(rss1 / 2**20, 1) if rss1 else None}
    return out


async def chaos(args, url: str, server: ServerUnderTest | None, pid: int | None) -> dict:
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port or 80
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    out: dict = {"url": url}
    async with httpx.AsyncClient(base_url=url, timeout=60, headers=headers) as client:
        cfg = (await client.get("/server_info")).json().get("config", {})
        seats = int(cfg.get("max_num_seqs") or 128)
        queued = cfg.get("max_queued_requests")
        capacity = seats + (int(queued) if queued is not None else 2 * seats)
        out["seats"], out["capacity"] = seats, capacity
        if args.scenarios & {"kills", "abandon"}:
            out.update(await kills_and_abandon(args, client, host, port, seats, capacity,
                                               server, pid))

        if "pooling-flood" in args.scenarios:
            log(f"pooling flood: {args.flood_over} requests over the bound, "
                f"{args.flood_at} at it")
            out["pooling_flood"] = await pooling_flood(args, client, cfg)
            log(f"pooling flood: {out['pooling_flood'].get('checks')}")

        if "operator-abandon" in args.scenarios:
            log(f"operator calls abandoned after {args.operator_timeout_s * 1e3:.0f} ms, "
                f"{args.operator_rounds} rounds")
            out["operator_abandon"] = await operator_abandon(args, client, server)
            log(f"operator calls: {out['operator_abandon'].get('checks')}")
    if server is not None and "sigterm" in args.scenarios:
        log("sigterm under load")
        out["sigterm"] = await sigterm_under_load(args, server, seats)
    return out


def cpu_name() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def verdicts(result: dict, abandon: int) -> dict[str, bool]:
    """The checks of the scenarios that ran, by name."""
    checks: dict[str, bool] = {}
    ran = [result[part] for part in ("kills", "abandon") if part in result]
    if ran:
        checks["no_5xx"] = not any(part["server_errors"] for part in ran)
    if "kills" in result:
        checks["no_stuck_kills"] = "stuck" not in result["kills"]["by_kind"]
        checks["settled_after_kills"] = result["settle_after_kills"]["ok"]
    if "abandon" in result:
        checks["settled_after_abandon"] = result["settle_after_abandon"]["ok"]
        checks["abandoned_enough"] = result["abandon"]["abandoned_while_queued"] >= abandon
        checks["queue_was_used"] = result["abandon"]["max_waiting_seen"] > 0 or abandon == 0
    if "canary" in result:
        checks["alive"] = result["alive"]
        checks["canary_unchanged"] = result["canary"]["unchanged"]
    for part, name in (("pooling_flood", "pooling_flood"),
                       ("operator_abandon", "operator_abandon"),
                       ("sigterm", "sigterm_all_told_and_exit_0")):
        if part in result:
            checks[name] = result[part]["ok"]
    return checks


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--start-server", action="store_true",
                   help="launch `python -m server` on a free loopback port (ignores --url); "
                        f"defaults: {' '.join(DEFAULT_SERVER_ARGS)}")
    p.add_argument("--server-args", default="", help="more arguments for the started server")
    p.add_argument("--pid", type=int, default=None, help="server PID for RSS (with --url)")
    p.add_argument("--kills", type=int, default=1000)
    p.add_argument("--abandon", type=int, default=1000)
    p.add_argument("--kill-concurrency", type=int, default=None, help="default: the seats")
    p.add_argument("--kill-plans", default=",".join(KILL_PLANS),
                   help="where killed clients stop, a comma-separated subset of the default")
    p.add_argument("--close", choices=["rst", "fin", "both"], default="both",
                   help="how killed clients close: TCP RST, plain close, or half of each")
    p.add_argument("--hold", type=float, default=1.5,
                   help="seconds a wave waits before closing what is still queued")
    p.add_argument("--model", default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scenarios", default=DEFAULT_SCENARIOS,
                   help=f"comma-separated, from {', '.join(SCENARIOS)}")
    p.add_argument("--flood-over", type=int, default=18,
                   help="pooling-flood: requests over the bound (every route and field, "
                        "half one more than the bound, half ~200 000 inputs)")
    p.add_argument("--flood-at", type=int, default=2,
                   help="pooling-flood: requests at the bound, sent with them")
    p.add_argument("--flood-at-timeout", type=float, default=600.0,
                   help="pooling-flood: seconds an at-bound request may take")
    p.add_argument("--flood-fast-s", type=float, default=2.0,
                   help="pooling-flood: the slowest over-bound 400 allowed, in seconds")
    p.add_argument("--flood-stream-tokens", type=int, default=64,
                   help="pooling-flood: the canary stream's length")
    p.add_argument("--pooling-bound", type=int, default=2048,
                   help="pooling-flood: the server's --max-pooling-inputs, when /server_info "
                        "does not tell it")
    p.add_argument("--operator-rounds", type=int, default=3,
                   help="operator-abandon: how many times each operator route is abandoned")
    p.add_argument("--operator-timeout-s", type=float, default=0.05,
                   help="operator-abandon: when the client gives up on each call")
    p.add_argument("--operator-stream-tokens", type=int, default=96,
                   help="operator-abandon: the stream each call runs beside")
    args = p.parse_args()
    args.kill_plans = set(args.kill_plans.split(","))
    if not args.kill_plans <= set(KILL_PLANS):
        p.error(f"--kill-plans: choose from {', '.join(KILL_PLANS)}")
    args.scenarios = set(args.scenarios.split(","))
    if not args.scenarios <= set(SCENARIOS):
        p.error(f"--scenarios: choose from {', '.join(SCENARIOS)}")
    server = None
    try:
        if args.start_server:
            extra = shlex.split(args.server_args)
            if "pooling-flood" in args.scenarios and "--pooler-config" not in extra:
                extra += ["--pooler-config", FLOOD_POOLER]
            if "operator-abandon" in args.scenarios:
                if "--enable-dev-endpoints" not in extra:
                    extra += ["--enable-dev-endpoints"]
                if "--profiler-config" not in extra:
                    extra += ["--profiler-config", json.dumps(
                        {"profiler": "torch", "torch_profiler_with_stack": False,
                         "torch_profiler_dir": tempfile.mkdtemp(prefix="chaos-profiles-")})]
            if "--max-pooling-inputs" in extra[:-1]:
                args.pooling_bound = int(extra[extra.index("--max-pooling-inputs") + 1])
            server = ServerUnderTest(DEFAULT_SERVER_ARGS + extra)
            log(f"starting the server on {server.url} (pid {server.pid})")
            server.wait_ready()
            url, pid = server.url, server.pid
        else:
            url, pid = check_loopback(args.url), args.pid
        result = trio.run(chaos, args, url, server, pid)
        if server is not None:
            log_text = server.log_tail(200_000)
            result["server_log_errors"] = [
                line[:300] for line in log_text.splitlines()
                if " ERROR " in line or "Traceback" in line][:20]
    finally:
        if server is not None:
            server.close()
    result["checks"] = verdicts(result, args.abandon)
    result["cpu"] = cpu_name()
    result["ok"] = all(result["checks"].values())
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
