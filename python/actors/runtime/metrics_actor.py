"""The metrics actor: Prometheus metrics under vLLM's names, in a private registry.

Every other actor reports with `send_nowait` on a bounded channel and never waits; a full
channel drops the event and counts the drop (llmserve_metric_events_dropped_total). Gauges
come from engine snapshots, so a dropped snapshot is corrected by the next one.
Label values come from closed sets only (finish reasons, route templates, status classes).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
import trio

from actors.messages import EngineInfo, EngineStats
from actors.runtime import faults
from actors.runtime.messages import GroupFinished, MetricEvent, SequenceFinished, StepTokens

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
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)
ADMITTED_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
# vLLM's reasons: sequences held (--max-queued-requests) and the prefill backlog
# (--max-num-queued-tokens).
REJECTION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
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


def cache_config_info(info: EngineInfo) -> dict[str, str]:
    """vllm:cache_config_info's labels, spelled as vLLM spells its CacheConfig."""
    size_tokens = info.num_blocks * info.block_size
    return {
        "block_size": str(info.block_size),
        "cache_dtype": info.kv_cache_dtype,
        "enable_prefix_caching": str(info.enable_prefix_caching),
        "num_gpu_blocks": str(info.num_blocks),
        "kv_cache_size_tokens": str(size_tokens),
        "kv_cache_max_concurrency": f"{size_tokens / max(info.max_model_len, 1):.2f}",
    }


class MetricsActor:
    def __init__(
        self,
        model_name: str,
        max_model_len: int,
        recv: trio.MemoryReceiveChannel[MetricEvent],
        cache_info: dict[str, str] | None = None,
        engine: int = 0,
    ) -> None:
        """cache_info: vllm:cache_config_info's labels (besides engine), fixed at startup.
        engine: the `engine` label's value, as vLLM numbers its data-parallel engines."""
        self.registry = CollectorRegistry(auto_describe=True)
        self._recv = recv
        self._last: EngineStats | None = None
        labels = ["model_name", "engine"]
        self._lv = (model_name, str(engine))
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
        self.prompt_by_source = counter(
            "vllm:prompt_tokens_by_source", "Prompt tokens by where their KV came from.",
            ("source",),
        )
        self.prompt_cached = counter(
            "vllm:prompt_tokens_cached", "Prompt tokens whose KV came from a cache."
        )
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
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total", "Tokens per engine step.", ITERATION_TOKEN_BUCKETS
        )
        self.step_admitted = hist(
            "llmserve_step_admitted_sequences",
            "Sequences one engine step moved from waiting to running (steps admitting any).",
            ADMITTED_BUCKETS,
        )
        self.max_gen_len = hist(
            "vllm:request_max_num_generation_tokens",
            "Longest generation among the n sequences of a prompt.", tokens,
        )
        self.params_n = hist("vllm:request_params_n", "The n request parameter.", N_BUCKETS)
        self.params_max_tokens = hist(
            "vllm:request_params_max_tokens", "The max_tokens of each sequence.", tokens
        )
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Decode time per output token after the first, per sequence.", ITL_BUCKETS,
        )
        self.inference = hist(
            "vllm:request_inference_time_seconds", "Time running.", LATENCY_BUCKETS
        )
        self.prefill = hist("vllm:request_prefill_time_seconds", "Time in prefill.",
                            LATENCY_BUCKETS)
        self.decode = hist("vllm:request_decode_time_seconds", "Time in decode.", LATENCY_BUCKETS)
        self.prefill_computed = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Prompt tokens whose KV was computed (not cached), per sequence.", tokens,
        )
        self.seq_preemptions = hist(
            "vllm:request_num_preemptions", "Preemptions per sequence.", PREEMPTION_BUCKETS
        )
        self.rejections = Counter(
            "vllm:admission_rejections",
            "Requests refused because the server was at capacity.",
            ["model_name", "reason"],
            registry=r,
        )
        for reason in REJECTION_REASONS:
            self.rejections.labels(model_name, reason)
        if cache_info is not None:
            info = dict(cache_info, engine=str(engine))
            Gauge(
                "vllm:cache_config_info", "Information of the engine's cache config.",
                list(info), registry=r,
            ).labels(**info).set(1)
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
        for c in (self.prompt_tokens, self.generation_tokens, self.prompt_cached):
            c.labels(*self._lv)
        for source in PROMPT_SOURCES:
            self.prompt_by_source.labels(*self._lv, source)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
        async with self._recv:
            task_status.started()
            async for event in self._recv:
                faults.check("metrics")
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
        elif isinstance(event, StepTokens):
            # Counters refuse negative steps (ValueError would end this actor): every count
            # is clamped, and the cached part never exceeds the prompt.
            prompt = max(event.num_prompt_tokens, 0)
            cached = min(max(event.num_cached_prompt_tokens, 0), prompt)
            generated = max(event.num_generation_tokens, 0)
            self.prompt_tokens.labels(*lv).inc(prompt)
            self.prompt_by_source.labels(*lv, "local_compute").inc(prompt - cached)
            self.prompt_by_source.labels(*lv, "local_cache_hit").inc(cached)
            self.prompt_cached.labels(*lv).inc(cached)
            self.generation_tokens.labels(*lv).inc(generated)
            self.iteration_tokens.labels(*lv).observe(prompt + generated)
            if event.num_admitted_sequences > 0:
                self.step_admitted.labels(*lv).observe(event.num_admitted_sequences)
        elif isinstance(event, SequenceFinished):
            self._finished(event)
        elif isinstance(event, GroupFinished):
            self.params_n.labels(*lv).observe(event.n)
            self.max_gen_len.labels(*lv).observe(event.max_num_generation_tokens)

    def _finished(self, event: SequenceFinished) -> None:
        lv = self._lv
        reason = event.finish_reason if event.finish_reason in FINISH_REASONS else "error"
        self.success.labels(*lv, reason).inc()
        self.prompt_len.labels(*lv).observe(event.num_prompt_tokens)
        self.gen_len.labels(*lv).observe(event.num_generation_tokens)
        self.e2e.labels(*lv).observe(event.e2e_seconds)
        self.seq_preemptions.labels(*lv).observe(event.num_preemptions)
        if event.max_tokens:
            self.params_max_tokens.labels(*lv).observe(event.max_tokens)
        if event.queue_seconds is not None:
            self.queue.labels(*lv).observe(event.queue_seconds)
            computed = event.num_prompt_tokens - max(event.num_cached_tokens, 0)
            self.prefill_computed.labels(*lv).observe(max(computed, 0))
        if event.ttft_seconds is not None:
            self.ttft.labels(*lv).observe(event.ttft_seconds)
        for gap in event.inter_token_seconds:
            self.itl.labels(*lv).observe(gap)
        if event.decode_seconds is not None:
            self.prefill.labels(*lv).observe(event.prefill_seconds or 0.0)
            self.decode.labels(*lv).observe(event.decode_seconds)
            self.inference.labels(*lv).observe(event.inference_seconds or 0.0)
            n = event.num_generation_tokens
            self.tpot.labels(*lv).observe(event.decode_seconds / (n - 1) if n > 1 else 0.0)

    def count_http(self, handler: str, method: str, status: int) -> None:
        """Called by the HTTP edge (same thread). handler is a route template or 'unmatched'."""
        m = method if method in METHODS else "other"
        cls = f"{status // 100}xx" if 200 <= status < 600 else "5xx"
        self.http.labels(handler, m, cls).inc()

    def count_rejection(self, reason: str = "max_num_queued_reqs") -> None:
        """Called by the HTTP edge when admission refuses a request for capacity."""
        self.rejections.labels(self._lv[0], reason if reason in REJECTION_REASONS else
                               REJECTION_REASONS[0]).inc()

    def load_gauges(self) -> list[tuple[str, float]]:
        """The scheduler's gauges an ORCA load report names (server.api.orca), in vLLM's
        order: requests waiting, then KV cache usage (1 = 100%)."""
        last = self._last
        return [("num_requests_waiting", float(last.num_waiting) if last else 0.0),
                ("kv_cache_usage_perc", float(last.kv_usage) if last else 0.0)]

    def count_dropped(self, n: int = 1) -> None:
        self.dropped.inc(n)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
