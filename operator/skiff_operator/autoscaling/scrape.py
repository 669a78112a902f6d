"""Reading load: each ready pod's /metrics and the router's, summed into one number per InferenceService."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families
from skiff_contract import API_PORT_NAME, METRICS_PORT_NAME

from .metrics import HELD, INFLIGHT, QUEUED, RUNNING, SIGNALS

log = logging.getLogger("skiff_operator.autoscaling")
DEFAULT_PORT = 8000


def metric_sum(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """Sum of a metric's samples (matching `labels`) in a Prometheus text page; TP ranks other than 0 are
    skipped so a multi-rank pod counts once."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != name or sample.labels.get("tp_rank", "0") != "0":
                continue
            if labels and any(sample.labels.get(k) != v for k, v in labels.items()):
                continue
            total += sample.value
    return total


def pod_ready(pod: dict) -> bool:
    status = pod.get("status") or {}
    if pod["metadata"].get("deletionTimestamp") or not status.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def pod_metrics_url(pod: dict) -> str:
    """The pod's port named `metrics` (its own /metrics listener), else the API port named `http`."""
    ports = {
        p.get("name"): p["containerPort"]
        for container in (pod.get("spec") or {}).get("containers") or []
        for p in container.get("ports") or []
    }
    port = ports.get(METRICS_PORT_NAME) or ports.get(API_PORT_NAME) or DEFAULT_PORT
    ip = pod["status"]["podIP"]
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}/metrics"


@dataclass(frozen=True)
class Reading:
    load: float  # the policy's metric summed over the pods that answered, plus router-held requests
    ready: int  # ready pods that answered their /metrics
    held: float  # requests the router holds for this model
    detail: str
    active: float = 0.0  # all work seen: running + queued on pods, in flight + held at routers


async def read_load(
    client: httpx.AsyncClient, metric: str, pods: list[dict], model: str, router_urls: list[str]
) -> Reading:
    """Scrape every ready pod and every router replica; unreachable ones count as not ready / absent."""
    signal = SIGNALS[metric]
    ready = [p for p in pods if pod_ready(p)]

    async def scrape(url: str) -> str | None:
        try:
            r = await client.get(url)
            r.raise_for_status()
            return r.text
        except httpx.HTTPError as e:
            log.info("scraping %s failed: %s", url, e)
            return None

    texts = await asyncio.gather(*(scrape(pod_metrics_url(p)) for p in ready))
    routers = [t for t in await asyncio.gather(*(scrape(u) for u in router_urls)) if t is not None]
    answered = [t for t in texts if t is not None]
    held = sum(metric_sum(t, HELD, {"model": model}) for t in routers)
    active = (
        held
        + sum(metric_sum(t, m) for t in answered for m in (RUNNING, QUEUED))
        + sum(metric_sum(t, INFLIGHT, {"model": model}) for t in routers)
    )
    if signal.pod_metric is not None:
        pod_load = sum(metric_sum(t, signal.pod_metric) for t in answered)
        load = pod_load + held
        detail = f"{signal.pod_metric}={pod_load:g} over {len(answered)} pods, router held={held:g}"
    else:
        load = sum(metric_sum(t, m, {"model": model}) for t in routers for m in signal.router_metrics)
        detail = f"router in-flight+held={load:g} ({len(routers)}/{len(router_urls)} routers answered)"
    return Reading(load, len(answered), held, detail, active)
