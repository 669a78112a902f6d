"""Scaling up while one pod serves is no outage: `kubectl scale sksvc NAME --replicas=3` with one ready
pod keeps Ready=True in every version of the object the API server stored (replayed with a watch from the
resourceVersion before the scale), reports the scale as Progressing, and posts only Normal events, from
the first start on. The operator runs as its installed ServiceAccount; the fake kubelet holds the new
pods back (starting), then lets them become ready."""

from __future__ import annotations

from typing import Any

import kubernetes
import pytest
from skiff_operator.spec import GROUP, PLURAL, VERSION
from support.kube import Api, create_isvc, get_isvc, wait_for_api
from support.kubectl import kubectl
from support.kubelet import FakeKubelet

pytestmark = pytest.mark.timeout(120)


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == ctype)


def versions_since(api: Api, ns: str, name: str, resource_version: str) -> list[dict[str, Any]]:
    """Every stored version of the object after `resource_version`, as a watch from there replays them."""
    stream = kubernetes.watch.Watch().stream(
        api.custom.list_namespaced_custom_object,
        GROUP,
        VERSION,
        ns,
        PLURAL,
        field_selector=f"metadata.name={name}",
        resource_version=resource_version,
        timeout_seconds=2,
    )
    return [event["object"] for event in stream if event["type"] == "MODIFIED"]


def test_scale_up_while_one_pod_serves_keeps_ready(
    api: Api, namespace: str, operator, kubelet: FakeKubelet
) -> None:
    ns, name = namespace, "grow"
    create_isvc(api, ns, name, {"resources": {"gpus": 0}})
    kubectl(
        api.kubeconfig, "wait", "-n", ns, "--for=condition=Available=True", f"sksvc/{name}", "--timeout=60s"
    )
    before = get_isvc(api, ns, name)
    assert condition(before, "Ready")["status"] == "True" and before["status"]["readyReplicas"] == 1

    kubelet.hold = True  # the new pods are created and stay starting until released
    kubectl(api.kubeconfig, "scale", "-n", ns, f"sksvc/{name}", "--replicas=3")

    def scaling() -> dict[str, Any] | None:
        obj = get_isvc(api, ns, name)
        st = obj["status"]
        return obj if st.get("desiredReplicas") == 3 and st.get("replicas") == 3 else None

    during = wait_for_api(scaling, 30, "status reporting 3 replicas wanted, 3 created")
    assert condition(during, "Ready")["status"] == "True" and during["status"]["readyReplicas"] == 1
    assert condition(during, "Available")["status"] == "False"
    assert condition(during, "Progressing")["reason"] == "Scaling"
    assert condition(during, "Degraded")["status"] == "False"
    assert during["status"]["phase"] == "Updating"

    kubelet.hold = False
    kubectl(
        api.kubeconfig, "wait", "-n", ns, "--for=condition=Available=True", f"sksvc/{name}", "--timeout=60s"
    )
    after = wait_for_api(
        lambda: (o := get_isvc(api, ns, name))["status"].get("readyReplicas") == 3 and o, 30, "3 ready"
    )
    assert after["status"]["phase"] == "Ready"

    versions = versions_since(api, ns, name, before["metadata"]["resourceVersion"])
    assert versions, "the watch replayed no versions"
    readiness = [(condition(v, "Ready")["status"], condition(v, "Ready")["reason"]) for v in versions]
    assert set(readiness) == {("True", "Serving")}, readiness
    assert condition(after, "Ready")["lastTransitionTime"] == condition(before, "Ready")["lastTransitionTime"]

    ours = f"involvedObject.kind=InferenceService,involvedObject.name={name}"  # not the Deployment's
    events = api.core.list_namespaced_event(ns, field_selector=ours).items
    kinds = sorted({(e.type, e.reason) for e in events})
    assert all(kind == "Normal" for kind, _ in kinds), kinds
    assert ("Normal", "Scaling") in kinds and ("Normal", "Ready") in kinds, kinds
