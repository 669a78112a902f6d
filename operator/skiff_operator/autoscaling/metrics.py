"""The load signals each autoscaling `metric` stands for, in every place they are read."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Signal:
    pod_metric: str | None  # read from each pod's /metrics (None: read from the router)
    adapter_name: str  # how a Prometheus adapter exposes it to an HPA (colons are not allowed there)
    router_metrics: tuple[str, ...] = ()  # read from the router's /metrics, labelled by model


SIGNALS: dict[str, Signal] = {
    "queue": Signal("sglang:num_queue_reqs", "sglang_num_queue_reqs"),
    "running": Signal("sglang:num_running_reqs", "sglang_num_running_reqs"),
    "kvUsage": Signal("sglang:token_usage", "sglang_token_usage"),
    "concurrency": Signal(None, "skiff_router_concurrency", ("skiff_router_inflight", "skiff_router_held")),
}
HELD = "skiff_router_held"  # requests waiting at the router: load even at zero replicas, whatever the metric
INFLIGHT = "skiff_router_inflight"
RUNNING, QUEUED = "sglang:num_running_reqs", "sglang:num_queue_reqs"  # "any work" for idle-to-zero
