"""`mode: hpa` and `mode: keda`: the autoscaler objects that target the InferenceService's scale subresource.

Called by the operator's desired-children function (`autoscaler_objects`); `mode: operator` renders nothing
(the operator's own loop scales, see handlers.py).
"""

from __future__ import annotations

from typing import Any

from skiff_contract import API_VERSION, KIND

from skiff_operator.metadata import child_metadata, served_name
from skiff_operator.spec import parse_spec

from .metrics import HELD, SIGNALS

HPA_PERIOD = 15  # seconds per step policy


def _scale_target(isvc: dict[str, Any]) -> dict[str, str]:
    return {"apiVersion": API_VERSION, "kind": KIND, "name": isvc["metadata"]["name"]}


def _quantity(value: float) -> str:
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def _behavior(a: Any) -> dict[str, Any]:
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": a.scale_up_stabilization_seconds,
            "selectPolicy": "Max",
            "policies": [{"type": "Pods", "value": a.max_scale_up_step, "periodSeconds": HPA_PERIOD}],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": a.scale_down_stabilization_seconds,
            "selectPolicy": "Max",
            "policies": [{"type": "Pods", "value": a.max_scale_down_step, "periodSeconds": HPA_PERIOD}],
        },
    }


def hpa(isvc: dict[str, Any], api_version: str = "autoscaling/v2") -> dict[str, Any]:
    spec = parse_spec(isvc.get("spec"))
    a = spec.autoscaling
    signal = SIGNALS[a.metric]
    target = {"type": "AverageValue", "averageValue": _quantity(a.target_per_replica)}
    if signal.pod_metric is not None:
        metric = {"type": "Pods", "pods": {"metric": {"name": signal.adapter_name}, "target": target}}
    else:  # router concurrency is not a per-pod series: an External metric selected by model
        selector = {"matchLabels": {"model": served_name(isvc, spec)}}
        metric = {
            "type": "External",
            "external": {"metric": {"name": signal.adapter_name, "selector": selector}, "target": target},
        }
    return {
        "apiVersion": api_version,  # autoscaling/v2beta2 (the same fields) on clusters older than 1.23
        "kind": "HorizontalPodAutoscaler",
        "metadata": child_metadata(isvc, isvc["metadata"]["name"]),
        "spec": {
            "scaleTargetRef": _scale_target(isvc),
            "minReplicas": max(1, a.min_replicas),
            "maxReplicas": a.max_replicas,
            "metrics": [metric],
            "behavior": _behavior(a),
        },
    }


def prometheus_query(isvc: dict[str, Any]) -> str:
    """The summed load of one InferenceService, plus the requests its router holds (non-zero at zero pods,
    which is what activates KEDA from zero)."""
    spec = parse_spec(isvc.get("spec"))
    signal = SIGNALS[spec.autoscaling.metric]
    meta = isvc["metadata"]
    model = served_name(isvc, spec)
    if signal.pod_metric is not None:
        # `service` is the main Service (the headless `-pods` Service is scraped too and would double count)
        load = f'sum({signal.pod_metric}{{namespace="{meta["namespace"]}",service="{meta["name"]}"}})'
        parts = [load, f'sum({HELD}{{model="{model}"}})']
    else:
        parts = [f'sum({m}{{model="{model}"}})' for m in signal.router_metrics]
    return " + ".join(f"({p} or vector(0))" for p in parts)


def scaled_object(isvc: dict[str, Any]) -> dict[str, Any]:
    spec = parse_spec(isvc.get("spec"))
    a = spec.autoscaling
    name = isvc["metadata"]["name"]
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": child_metadata(isvc, name),
        "spec": {
            "scaleTargetRef": _scale_target(isvc),
            "minReplicaCount": a.min_replicas,
            "maxReplicaCount": a.max_replicas,
            "pollingInterval": HPA_PERIOD,
            "cooldownPeriod": a.idle_to_zero_seconds,  # KEDA: idle time before scaling to minReplicaCount 0
            "advanced": {"horizontalPodAutoscalerConfig": {"name": f"{name}-keda", "behavior": _behavior(a)}},
            "triggers": [
                {
                    "type": "prometheus",
                    "metricType": "AverageValue",
                    "metadata": {
                        "serverAddress": a.prometheus_address,
                        "query": prometheus_query(isvc),
                        "threshold": f"{a.target_per_replica:g}",
                        "activationThreshold": "0",
                    },
                }
            ],
        },
    }


def autoscaler_objects(isvc: dict[str, Any], hpa_api_version: str = "autoscaling/v2") -> list[dict[str, Any]]:
    """The HPA or ScaledObject an InferenceService's `spec.autoscaling.mode` asks for (none for `operator`)."""
    spec = parse_spec(isvc.get("spec"))
    if spec.autoscaling is None or spec.autoscaling.mode == "operator":
        return []
    return [hpa(isvc, hpa_api_version)] if spec.autoscaling.mode == "hpa" else [scaled_object(isvc)]
