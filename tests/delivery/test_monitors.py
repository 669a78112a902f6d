"""The chart's ServiceMonitors select what they mean to: each model pod through one Service only (the
headless `-pods` one, the only one with the metrics port), the router's and the operator's metrics
Services, whose port is their container's. Selectors are evaluated by a real kube-apiserver
(support.kube)."""

from __future__ import annotations

from typing import Any

import pytest
from delivery_helpers import find, renderer
from skiff_operator import render
from skiff_operator.spec import parse_spec
from support.kube import kube_api

MONITORED = {"serviceMonitor": {"enabled": True}}


def objects(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for objs in renderer.render(values).values() for o in objs]


def selector_string(selector: dict[str, Any]) -> str:
    """A LabelSelector (matchLabels, matchExpressions) in the API's label-selector query syntax."""
    terms = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for e in selector.get("matchExpressions") or []:
        op, key, values = e["operator"], e["key"], ",".join(e.get("values") or [])
        terms.append(
            {"Exists": key, "DoesNotExist": f"!{key}", "In": f"{key} in ({values})"}.get(
                op, f"{key} notin ({values})"
            )
        )
    return ",".join(terms)


def model_services(name: str, namespace: str) -> list[dict[str, Any]]:
    isvc = {"metadata": {"name": name, "namespace": namespace, "uid": "0000-1111"}, "spec": {}}
    return render.services(isvc, parse_spec({}))


def test_operator_monitor_scrapes_the_operator_metrics_port():
    objs = objects(MONITORED)
    (monitor,) = find(objs, "ServiceMonitor", "skiff-operator")
    (service,) = find(objs, "Service", "skiff-operator-metrics")
    (deployment,) = find(objs, "Deployment", "skiff-operator")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics" and endpoint["honorLabels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert f"--metrics-port={ports['metrics']}" in container["args"] and ports["metrics"] != ports["health"]
    (svc_port,) = service["spec"]["ports"]
    assert svc_port["targetPort"] == "metrics"
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_operator_ports_must_differ():
    with pytest.raises(Exception, match="operator.metricsPort must differ from operator.healthPort"):
        objects({"operator": {"healthPort": 9000, "metricsPort": 9000}})


def test_selectors_pick_one_service_per_pod_on_a_real_api_server():
    objs = objects(MONITORED)
    monitors = {m["metadata"]["name"]: m for m in find(objs, "ServiceMonitor")}
    ns = "skiff-system"  # the chart's objects say so; model Services may live anywhere
    with kube_api() as api:
        api.core.create_namespace({"metadata": {"name": ns}})
        for svc in model_services("demo", ns):
            api.core.create_namespaced_service(ns, svc)
        (operator_service,) = find(objs, "Service", "skiff-operator-metrics")
        api.core.create_namespaced_service(ns, operator_service)
        for router_service in find(objs, "Service", "skiff-router"):
            api.core.create_namespaced_service(ns, router_service)

        def selected(monitor: str) -> set[str]:
            """Services the monitor's selector picks that have the port its endpoints scrape."""
            spec = monitors[monitor]["spec"]
            ports = {e["port"] for e in spec["endpoints"]}
            query = selector_string(spec["selector"])
            picked = api.core.list_namespaced_service(ns, label_selector=query).items
            return {s.metadata.name for s in picked if ports & {p.name for p in s.spec.ports}}

        assert selected("skiff-models") == {"demo-pods"}
        assert selected("skiff-operator") == {"skiff-operator-metrics"}
        assert selected("skiff-router") == {"skiff-router"}
