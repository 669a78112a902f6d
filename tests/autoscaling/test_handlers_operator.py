"""The autoscaler's kopf handlers inside a real operator process (kopf running skiff_operator.handlers, which
loads the autoscaling handlers) against a real kube-apiserver: the timer enforces the bounds through /scale
and posts the decision as an event, the Deployment follows spec.replicas, and a user's HPA is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid

import kubernetes
import pytest
from conftest import wait_for
from skiff_operator.spec import GROUP, PLURAL, VERSION

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def operator_process(kube):
    ns = f"as-{uuid.uuid4().hex[:6]}"
    kubernetes.client.CoreV1Api(kube).create_namespace({"metadata": {"name": ns}})
    log = tempfile.NamedTemporaryFile(prefix="skiff-operator-", suffix=".log", delete=False)  # noqa: SIM115
    env = dict(os.environ, SKIFF_AUTOSCALE_INTERVAL="1", KUBECONFIG=os.environ["SKIFF_TEST_KUBECONFIG"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "kopf", "run", "--standalone", "-n", ns, "-m", "skiff_operator.handlers"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        yield ns, log.name
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        kubernetes.client.CoreV1Api(kube).delete_namespace(ns)


def events(core, ns: str, name: str) -> list[tuple[str, str, str]]:
    return [
        (e.type, e.reason, e.message or "")
        for e in core.list_namespaced_event(ns).items
        if e.involved_object.name == name and e.involved_object.kind == "InferenceService"
    ]


def test_timer_scales_through_scale_subresource_and_reports(kube, operator_process):
    ns, log = operator_process
    custom, core, apps = (
        kubernetes.client.CustomObjectsApi(kube),
        kubernetes.client.CoreV1Api(kube),
        kubernetes.client.AppsV1Api(kube),
    )
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": "smol"},
        "spec": {
            "model": {"source": "hf://org/smol"},
            "replicas": 0,
            "autoscaling": {"mode": "operator", "minReplicas": 2, "maxReplicas": 3},
        },
    }
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)

    def scaled():
        isvc = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "smol")
        return isvc["spec"]["replicas"] == 2

    wait_for(scaled, timeout=60, what=f"replicas raised to minReplicas (operator log: {log})")
    wait_for(
        lambda: any(r == "BelowMinimum" and "replicas 0 -> 2" in m for _, r, m in events(core, ns, "smol")),
        timeout=30,
        what="a BelowMinimum event",
    )
    wait_for(
        lambda: apps.read_namespaced_deployment("smol", ns).spec.replicas == 2,
        timeout=30,
        what="the Deployment following spec.replicas",
    )
    # kubectl scale: the Deployment follows at once, the timer puts it back within bounds
    custom.patch_namespaced_custom_object_scale(GROUP, VERSION, ns, PLURAL, "smol", {"spec": {"replicas": 7}})
    wait_for(
        lambda: (
            custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "smol")["spec"]["replicas"] == 3
        ),
        timeout=30,
        what="AboveMaximum correction",
    )
    wait_for(
        lambda: apps.read_namespaced_deployment("smol", ns).spec.replicas == 3,
        timeout=30,
        what="the Deployment at 3",
    )


def test_user_hpa_is_left_alone(kube, operator_process):
    ns, log = operator_process
    custom, core = kubernetes.client.CustomObjectsApi(kube), kubernetes.client.CoreV1Api(kube)
    kubernetes.client.AutoscalingV1Api(kube).create_namespaced_horizontal_pod_autoscaler(
        ns,
        {
            "metadata": {"name": "users-own"},
            "spec": {
                "scaleTargetRef": {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "InferenceService",
                    "name": "s2",
                },
                "minReplicas": 1,
                "maxReplicas": 5,
            },
        },
    )
    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        PLURAL,
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "InferenceService",
            "metadata": {"name": "s2"},
            "spec": {
                "model": {"source": "hf://org/smol"},
                "replicas": 0,
                "autoscaling": {"mode": "operator", "minReplicas": 2, "maxReplicas": 3},
            },
        },
    )
    wait_for(
        lambda: any(t == "Warning" and r == "ExternalAutoscaler" for t, r, _ in events(core, ns, "s2")),
        timeout=60,
        what=f"an ExternalAutoscaler warning (operator log: {log})",
    )
    time.sleep(3)  # three more ticks
    assert custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "s2")["spec"]["replicas"] == 0
    assert (
        sum(r == "ExternalAutoscaler" for _, r, _ in events(core, ns, "s2")) == 1
    )  # said once, not per tick
