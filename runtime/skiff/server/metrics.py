"""Prometheus metrics, under the names Kubernetes routers and autoscalers already read (sglang:*),
plus skiff:* page accounting that tests and dashboards use to spot KV leaks.

With several API workers each keeps its own in prometheus-client's multiprocess mode (skiff_process.workers) and
/metrics sums them: counters and histograms add up, `inflight` is the sum over the live workers, and the
engine's gauges (every worker gets the same heartbeat) take the most recent value."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from skiff_process.workers import multiprocess_metrics_dir, render_metrics

from skiff.server.messages import SchedulerStats

_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
_ITL_BUCKETS = (
    0.002,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.0,
    5.0,
)


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.multiprocess_dir = multiprocess_metrics_dir()  # raises when the mode came too late
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]
        self._labels = {"model_name": model_name}

        def gauge(name: str, doc: str, mode: str = "mostrecent") -> Any:
            return Gauge(name, doc, labels, registry=r, multiprocess_mode=mode).labels(**self._labels)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=r).labels(**self._labels)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(**self._labels)

        self.num_queue_reqs = gauge("sglang:num_queue_reqs", "Requests waiting in the scheduler's queue")
        self.num_running_reqs = gauge("sglang:num_running_reqs", "Requests in the running batch")
        self.token_usage = gauge("sglang:token_usage", "Fraction of the KV pool in use (0..1)")
        self.cache_hit_rate = gauge(
            "sglang:cache_hit_rate", "Prompt tokens served from the prefix cache / prompt tokens"
        )
        self.gen_throughput = gauge("sglang:gen_throughput", "Generated tokens per second (recent)")
        self.ttft = histogram("sglang:time_to_first_token_seconds", "Time to first token", _LATENCY_BUCKETS)
        self.itl = histogram("sglang:inter_token_latency_seconds", "Time between output tokens", _ITL_BUCKETS)
        self.e2e = histogram(
            "sglang:e2e_request_latency_seconds", "Request latency, arrival to last token", _LATENCY_BUCKETS
        )
        self.prompt_tokens = counter("sglang:prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter("sglang:generation_tokens", "Generated tokens")
        self.cached_tokens = counter("sglang:cached_tokens", "Prompt tokens served from the prefix cache")
        self.num_requests = counter("sglang:num_requests", "Finished requests")
        self.cache_config = Gauge(
            "sglang:cache_config_info",
            "KV cache geometry",
            ["page_size", "num_pages"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.pages_total = gauge("skiff:kv_pages_total", "KV pages in the pool")
        self.pages_free = gauge("skiff:kv_pages_free", "KV pages neither used nor cached")
        self.pages_cached = gauge(
            "skiff:kv_pages_cached", "KV pages held only by the prefix cache (evictable)"
        )
        self.pages_used = gauge("skiff:kv_pages_used", "KV pages held by live requests")
        self.preemptions = gauge("skiff:num_preemptions", "Requests retracted to free KV pages, since start")
        self.inflight = gauge(
            "skiff:inflight_requests", "Engine requests the API server is waiting on", mode="livesum"
        )
        self.finished = Counter(
            "skiff:requests_finished",
            "Finished engine requests by reason",
            ["model_name", "finish_reason"],
            registry=r,
        )
        self.errors = Counter(
            "skiff:http_errors", "Error responses by status", ["model_name", "status"], registry=r
        )

    def set_cache_config(self, page_size: int, num_pages: int) -> None:
        self.cache_config.labels(page_size=str(page_size), num_pages=str(num_pages)).set(1)

    def update_stats(self, stats: SchedulerStats) -> None:
        s = stats.engine
        self.gen_throughput.set(stats.gen_throughput)
        if s is None:
            return
        self.num_queue_reqs.set(s.num_queued)
        self.num_running_reqs.set(s.num_running)
        self.token_usage.set(s.token_usage)
        self.cache_hit_rate.set(s.cache_hit_rate)
        self.pages_total.set(s.total_pages)
        self.pages_free.set(s.free_pages)
        self.pages_cached.set(s.cached_pages)
        self.pages_used.set(s.used_pages)
        self.preemptions.set(s.num_preemptions)

    def render(self) -> bytes:
        return render_metrics(self.registry)
