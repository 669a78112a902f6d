"""Reading load from Prometheus text: per-pod sums, TP ranks counted once, readiness, router held requests."""

from __future__ import annotations

import asyncio

import httpx
from skiff_operator.autoscaling.scrape import metric_sum, pod_metrics_url, pod_ready, read_load

POD_TEXT = """# HELP sglang:num_queue_reqs q
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 3.0
sglang:num_queue_reqs{model_name="m",tp_rank="1"} 3.0
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 2.0
"""
ROUTER_TEXT = """# TYPE skiff_router_held gauge
skiff_router_held{model="m"} 2.0
skiff_router_held{model="other"} 7.0
# TYPE skiff_router_inflight gauge
skiff_router_inflight{model="m"} 5.0
"""


def pod(ip: str | None, ready: bool = True, port: int = 8000, deleting: bool = False) -> dict:
    return {
        "metadata": {"name": f"p-{ip}", **({"deletionTimestamp": "now"} if deleting else {})},
        "spec": {"containers": [{"name": "server", "ports": [{"name": "http", "containerPort": port}]}]},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_metric_sum_skips_other_tp_ranks_and_filters_labels():
    assert metric_sum(POD_TEXT, "sglang:num_queue_reqs") == 3.0
    assert metric_sum(POD_TEXT, "sglang:num_running_reqs") == 2.0
    assert metric_sum(ROUTER_TEXT, "skiff_router_held", {"model": "m"}) == 2.0
    assert metric_sum(ROUTER_TEXT, "skiff_router_held") == 9.0
    assert metric_sum(POD_TEXT, "absent") == 0.0


def test_pod_readiness_and_url():
    assert pod_ready(pod("10.0.0.1")) and not pod_ready(pod("10.0.0.1", ready=False))
    assert not pod_ready(pod(None)) and not pod_ready(pod("10.0.0.1", deleting=True))
    assert pod_metrics_url(pod("10.0.0.1", port=9000)) == "http://10.0.0.1:9000/metrics"
    assert pod_metrics_url(pod("fd00::5")) == "http://[fd00::5]:8000/metrics"
    split = pod("10.0.0.2")
    split["spec"]["containers"][0]["ports"].append({"name": "metrics", "containerPort": 9090})
    assert pod_metrics_url(split) == "http://10.0.0.2:9090/metrics"  # --metrics-port: its own listener


def test_read_load_over_http_with_an_unreachable_pod():
    pages = {"http://10.0.0.1:8000/metrics": POD_TEXT, "http://router/metrics": ROUTER_TEXT}

    def handler(request: httpx.Request) -> httpx.Response:
        text = pages.get(str(request.url))
        return httpx.Response(200, text=text) if text else httpx.Response(503)

    async def go(metric: str):
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await read_load(
                client,
                metric,
                [pod("10.0.0.1"), pod("10.0.0.2"), pod("10.0.0.3", ready=False)],
                "m",
                ["http://router/metrics"],
            )

    queue = asyncio.run(go("queue"))
    assert (queue.load, queue.ready, queue.held) == (5.0, 1, 2.0)  # 3 queued + 2 held; one pod did not answer
    assert queue.active == 12.0  # 3 queued + 2 running on the pod, 5 in flight + 2 held at the router
    concurrency = asyncio.run(go("concurrency"))
    assert concurrency.load == 7.0  # in-flight 5 + held 2, from the router only
