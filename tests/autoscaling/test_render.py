"""mode hpa / keda: the autoscaler objects, validated against Kubernetes schemas where one exists."""

from __future__ import annotations

import kubernetes_validate
import pytest
from skiff_operator.autoscaling.render import autoscaler_objects, prometheus_query
from skiff_operator.render import desired_children


def isvc(**autoscaling) -> dict:
    return {
        "apiVersion": "skiff.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "smol", "namespace": "ml", "uid": "u-1"},
        "spec": {"model": {"source": "hf://org/smol", "servedName": "smol-chat"}, "autoscaling": autoscaling},
    }


def test_operator_mode_and_no_autoscaling_render_nothing():
    assert autoscaler_objects(isvc(mode="operator", minReplicas=0)) == []
    plain = isvc()
    del plain["spec"]["autoscaling"]
    assert autoscaler_objects(plain) == []


@pytest.mark.parametrize(
    "metric,kind,name",
    [
        ("queue", "Pods", "sglang_num_queue_reqs"),
        ("kvUsage", "Pods", "sglang_token_usage"),
        ("concurrency", "External", "skiff_router_concurrency"),
    ],
)
def test_hpa_targets_the_scale_subresource(metric, kind, name):
    [hpa] = autoscaler_objects(
        isvc(
            mode="hpa",
            minReplicas=1,
            maxReplicas=5,
            metric=metric,
            targetPerReplica=0.5,
            scaleDownStabilizationSeconds=120,
            maxScaleUpStep=3,
        )
    )
    kubernetes_validate.validate(hpa, "1.30", strict=True)
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "skiff.dev/v1alpha1",
        "kind": "InferenceService",
        "name": "smol",
    }
    assert (spec["minReplicas"], spec["maxReplicas"]) == (1, 5)
    [m] = spec["metrics"]
    assert m["type"] == kind
    body = m[kind.lower()]
    assert body["metric"]["name"] == name and body["target"] == {
        "type": "AverageValue",
        "averageValue": "500m",
    }
    assert spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 120
    assert spec["behavior"]["scaleUp"]["policies"][0]["value"] == 3
    assert hpa["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_keda_scaled_object_scales_from_zero_on_router_held_requests():
    [so] = autoscaler_objects(
        isvc(
            mode="keda",
            minReplicas=0,
            maxReplicas=3,
            metric="running",
            targetPerReplica=4,
            idleToZeroSeconds=300,
            prometheusAddress="http://prometheus.mon:9090",
        )
    )
    assert (so["apiVersion"], so["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    spec = so["spec"]
    assert spec["scaleTargetRef"]["kind"] == "InferenceService"
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["cooldownPeriod"]) == (0, 3, 300)
    [trigger] = spec["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "prometheus" and meta["serverAddress"] == "http://prometheus.mon:9090"
    assert meta["threshold"] == "4" and meta["activationThreshold"] == "0"
    assert 'sglang:num_running_reqs{namespace="ml",service="smol"}' in meta["query"]
    assert 'skiff_router_held{model="smol-chat"}' in meta["query"]
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    kubernetes_validate.validate(
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "x"},
            "spec": {"scaleTargetRef": spec["scaleTargetRef"], "maxReplicas": 3, "behavior": behavior},
        },
        "1.30",
        strict=True,
    )


def test_concurrency_query_reads_the_router_only():
    q = prometheus_query(isvc(mode="keda", metric="concurrency", prometheusAddress="http://p:9090"))
    assert q == (
        '(sum(skiff_router_inflight{model="smol-chat"}) or vector(0)) + '
        '(sum(skiff_router_held{model="smol-chat"}) or vector(0))'
    )


def test_desired_children_include_the_autoscaler():
    kinds = [c["kind"] for c in desired_children(isvc(mode="hpa", minReplicas=2))]
    assert "HorizontalPodAutoscaler" in kinds and "Deployment" in kinds
