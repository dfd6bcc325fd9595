"""The metrics actor: Prometheus metrics under vLLM's names, in a private registry.

Every other actor reports with `send_nowait` on a bounded channel and never waits; a full
channel drops the event and counts the drop (llmserve_metric_events_dropped_total). Gauges
come from engine snapshots, so a dropped snapshot is corrected by the next one.
Label values come from closed sets only (finish reasons, route templates, status classes).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
import trio

from actors.runtime.metric_events import EngineStats, MetricEvent, SequenceFinished

# Bucket boundaries as vLLM's dashboards expect them.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort", "error")
STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx")
METHODS = ("GET", "POST", "OPTIONS", "HEAD", "other")

# Events in flight to this actor: the channel's size. Producers drop beyond it.
METRICS_CHANNEL_SIZE = 4096


def token_buckets(max_model_len: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to max_model_len."""
    out: list[float] = []
    base = 1
    while True:
        for m in (1, 2, 5):
            v = m * base
            if v > max_model_len:
                return out
            out.append(float(v))
        base *= 10


class MetricsActor:
    def __init__(
        self,
        model_name: str,
        max_model_len: int,
        recv: trio.MemoryReceiveChannel[MetricEvent],
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._recv = recv
        self._last: EngineStats | None = None
        labels = ["model_name", "engine"]
        self._lv = (model_name, "0")
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels + list(extra), registry=r)

        def hist(name: str, doc: str, buckets: tuple[float, ...] | list[float]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r)

        tokens = token_buckets(max_model_len)
        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to run.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV cache usage (1 = 100%).")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries (tokens).")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits (tokens).")
        self.preemptions = counter("vllm:num_preemptions", "Preemptions.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self.success = counter(
            "vllm:request_success", "Finished sequences by reason.", ("finished_reason",)
        )
        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Inter-token latency.", ITL_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "End-to-end latency.", LATENCY_BUCKETS)
        self.queue = hist("vllm:request_queue_time_seconds", "Time waiting.", LATENCY_BUCKETS)
        self.prompt_len = hist("vllm:request_prompt_tokens", "Prompt length.", tokens)
        self.gen_len = hist("vllm:request_generation_tokens", "Generation length.", tokens)
        self.http = Counter(
            "http_requests",
            "HTTP requests by route template, method and status class.",
            ["handler", "method", "status"],
            registry=r,
        )
        self.dropped = Counter(
            "llmserve_metric_events_dropped", "Metric events dropped on a full channel.", registry=r
        )
        for reason in FINISH_REASONS:
            self.success.labels(*self._lv, reason)
        for g in (self.running, self.waiting, self.kv_usage):
            g.labels(*self._lv).set(0)
        for c in (self.prefix_queries, self.prefix_hits, self.preemptions):
            c.labels(*self._lv)
        for c in (self.prompt_tokens, self.generation_tokens):
            c.labels(*self._lv)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
        async with self._recv:
            task_status.started()
            async for event in self._recv:
                self.apply(event)

    def apply(self, event: MetricEvent) -> None:
        lv = self._lv
        if isinstance(event, EngineStats):
            self.running.labels(*lv).set(event.num_running)
            self.waiting.labels(*lv).set(event.num_waiting)
            self.kv_usage.labels(*lv).set(event.kv_usage)
            last = self._last
            for counter, now, before in (
                (self.prefix_queries, event.prefix_cache_queries, last and last.prefix_cache_queries),
                (self.prefix_hits, event.prefix_cache_hits, last and last.prefix_cache_hits),
                (self.preemptions, event.num_preemptions, last and last.num_preemptions),
            ):
                delta = now - (before or 0)
                if delta > 0:
                    counter.labels(*lv).inc(delta)
            self._last = event
        elif isinstance(event, SequenceFinished):
            reason = event.finish_reason if event.finish_reason in FINISH_REASONS else "error"
            self.success.labels(*lv, reason).inc()
            self.prompt_tokens.labels(*lv).inc(event.num_prompt_tokens)
            self.generation_tokens.labels(*lv).inc(event.num_generation_tokens)
            self.prompt_len.labels(*lv).observe(event.num_prompt_tokens)
            self.gen_len.labels(*lv).observe(event.num_generation_tokens)
            self.e2e.labels(*lv).observe(event.e2e_seconds)
            if event.queue_seconds is not None:
                self.queue.labels(*lv).observe(event.queue_seconds)
            if event.ttft_seconds is not None:
                self.ttft.labels(*lv).observe(event.ttft_seconds)
            for gap in event.inter_token_seconds:
                self.itl.labels(*lv).observe(gap)

    def count_http(self, handler: str, method: str, status: int) -> None:
        """Called by the HTTP edge (same thread). handler is a route template or 'unmatched'."""
        m = method if method in METHODS else "other"
        cls = f"{status // 100}xx" if 200 <= status < 600 else "5xx"
        self.http.labels(handler, m, cls).inc()

    def count_dropped(self, n: int = 1) -> None:
        self.dropped.inc(n)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
