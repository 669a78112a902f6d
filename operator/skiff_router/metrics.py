"""The router's own Prometheus metrics (one registry per router, so tests can run several in a process).

`skiff_router_inflight` + `skiff_router_held` per model is what the operator's `concurrency` metric reads.
With --workers N every process keeps its own in multiprocess mode and /metrics sums them (skiff_process.workers).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from skiff_process.workers import multiprocess_metrics_dir, render_metrics


class RouterMetrics:
    def __init__(self) -> None:
        self.multiprocess_dir = multiprocess_metrics_dir()
        self.registry = CollectorRegistry()
        r = self.registry
        self.inflight = Gauge(
            "skiff_router_inflight",
            "requests being proxied to a backend",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.held = Gauge(
            "skiff_router_held",
            "requests held waiting for a ready replica",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.endpoints = Gauge(
            "skiff_router_endpoints",
            "ready endpoints known",
            ["model"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.routed = Counter(
            "skiff_router_routed", "requests sent to a backend", ["model", "endpoint"], registry=r
        )
        self.responses = Counter(
            "skiff_router_responses", "responses by status code", ["model", "code"], registry=r
        )
        self.rejected = Counter(
            "skiff_router_rejected", "requests refused by the router", ["model", "reason"], registry=r
        )
        self.retries = Counter(
            "skiff_router_retries", "attempts moved to another endpoint", ["model"], registry=r
        )
        self.scale_ups = Counter(
            "skiff_router_scale_from_zero", "scale-from-zero requests issued", ["model"], registry=r
        )
        self.tokens = Counter(
            "skiff_router_tokens", "tokens reported in responses' usage", ["model", "kind"], registry=r
        )
        self.ttfb = Histogram(
            "skiff_router_time_to_first_byte_seconds",
            "router arrival to first backend byte",
            ["model"],
            registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )

    def render(self) -> bytes:
        return render_metrics(self.registry)
