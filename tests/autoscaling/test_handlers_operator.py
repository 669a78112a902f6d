"""The autoscaler's kopf handlers inside a real operator process (kopf running skiff_operator.handlers, which
loads the autoscaling handlers) against a real kube-apiserver, logged in as the operator's ServiceAccount with
manifests/install.yaml's RBAC: the loop enforces the bounds through /scale and posts the decision as an
event, the Deployment follows spec.replicas in every mode, and a user's HPA is left alone."""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import pytest
from skiff_operator.spec import GROUP, PLURAL, VERSION
from support.kube import (
    Api,
    crd_established,
    create_isvc,
    create_user_hpa,
    get_isvc,
    missing_as_none,
    wait_for_api,
)
from support.operator_rbac import install_yaml_objects, installed_operator_kubeconfig
from support.process import Process

pytestmark = pytest.mark.timeout(240)


def autoscaled(replicas: int) -> dict:
    """An InferenceService spec at `replicas` that the operator's autoscaler keeps within 2..3."""
    bounds = {"mode": "operator", "minReplicas": 2, "maxReplicas": 3}
    return {"model": {"source": "hf://org/smol"}, "replicas": replicas, "autoscaling": bounds}


@pytest.fixture(scope="module")
def operator_kubeconfig(kube: Api, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("operator") / "kubeconfig"
    return installed_operator_kubeconfig(kube, install_yaml_objects(), path)


@pytest.fixture
def operator_process(kube: Api, operator_kubeconfig: Path):
    ns = f"as-{uuid.uuid4().hex[:6]}"
    kube.core.create_namespace({"metadata": {"name": ns}})
    env = dict(os.environ, SKIFF_AUTOSCALE_INTERVAL="1", KUBECONFIG=str(operator_kubeconfig))
    argv = [sys.executable, "-m", "kopf", "run", "--standalone", "-n", ns, "-m", "skiff_operator.handlers"]
    proc = Process(argv, env=env, name="skiff-operator")
    try:
        yield ns, proc.log_path
        text = proc.log(None)
        assert not any(bad in text for bad in ("Forbidden", "(403)", "step failed")), text[-4000:]
    finally:
        proc.stop(grace=30)
        kube.core.delete_namespace(ns)


def events(core, ns: str, name: str) -> list[tuple[str, str, str]]:
    return [
        (e.type, e.reason, e.message or "")
        for e in core.list_namespaced_event(ns).items
        if e.involved_object.name == name and e.involved_object.kind == "InferenceService"
    ]


def wait_scaled(kube: Api, ns: str, name: str, replicas: int, log: Path) -> None:
    """The InferenceService's spec.replicas at `replicas`, then its Deployment's following."""
    wait_for_api(
        lambda: get_isvc(kube, ns, name)["spec"]["replicas"] == replicas, 60, f"{name} at {replicas}", log=log
    )
    wait_for_api(
        lambda: kube.apps.read_namespaced_deployment(name, ns).spec.replicas == replicas,
        30,
        f"the Deployment of {name} following spec.replicas to {replicas}",
        log=log,
    )


def test_loop_scales_through_scale_subresource_and_reports(kube: Api, operator_process):
    ns, log = operator_process
    create_isvc(kube, ns, "smol", autoscaled(0))
    wait_scaled(kube, ns, "smol", 2, log)  # raised to minReplicas
    wait_for_api(
        lambda: any(
            r == "BelowMinimum" and "replicas 0 -> 2" in m for _, r, m in events(kube.core, ns, "smol")
        ),
        timeout=30,
        what="a BelowMinimum event",
    )
    # kubectl scale: the Deployment follows at once, the timer puts it back within bounds (AboveMaximum)
    scale = {"spec": {"replicas": 7}}
    kube.custom.patch_namespaced_custom_object_scale(GROUP, VERSION, ns, PLURAL, "smol", scale)
    wait_scaled(kube, ns, "smol", 3, log)


def test_user_hpa_is_left_alone(kube: Api, operator_process):
    ns, log = operator_process
    create_user_hpa(kube, ns, "users-own", target="s2", min_replicas=1, max_replicas=5)
    create_isvc(kube, ns, "s2", autoscaled(0))
    core = kube.core
    wait_for_api(
        lambda: any(t == "Warning" and r == "ExternalAutoscaler" for t, r, _ in events(core, ns, "s2")),
        timeout=60,
        what="an ExternalAutoscaler warning",
        log=log,
    )
    time.sleep(3)  # three more ticks
    assert get_isvc(kube, ns, "s2")["spec"]["replicas"] == 0
    assert (
        sum(r == "ExternalAutoscaler" for _, r, _ in events(core, ns, "s2")) == 1
    )  # said once, not per tick


def install_stand_in_keda_crd(kube: Api) -> None:
    """KEDA's ScaledObject kind, schema-less: the test plays KEDA (there is no KEDA on the test server)."""
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "scaledobjects.keda.sh"},
        "spec": {
            "group": "keda.sh",
            "scope": "Namespaced",
            "names": {"kind": "ScaledObject", "plural": "scaledobjects", "singular": "scaledobject"},
            "versions": [
                {
                    "name": "v1alpha1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }
    if missing_as_none(lambda: kube.ext.read_custom_resource_definition("scaledobjects.keda.sh")) is None:
        kube.ext.create_custom_resource_definition(crd)
    wait_for_api(lambda: crd_established(kube.ext, "scaledobjects.keda.sh"), 30, "the ScaledObject CRD")


@pytest.mark.parametrize("mode", ["hpa", "keda"])
def test_external_modes_move_the_deployment(kube: Api, operator_process, mode: str):
    """hpa and keda modes: the operator renders the HPA / ScaledObject, and what those write (the scale
    subresource of the InferenceService, played here as `kubectl scale sksvc` does it) reaches the
    Deployment. The test server (1.20) serves autoscaling/v2beta2, not v2, and runs no HPA controller."""
    ns, log = operator_process
    if mode == "keda":
        install_stand_in_keda_crd(kube)
    autoscaling = {"mode": mode, "maxReplicas": 4}
    if mode == "keda":
        autoscaling["prometheusAddress"] = "http://prometheus.monitoring:9090"
    spec = {"model": {"source": "hf://org/smol"}, "autoscaling": autoscaling}
    create_isvc(kube, ns, "ext", spec)
    wait_scaled(kube, ns, "ext", 1, log)
    if mode == "hpa":
        hpa = wait_for_api(
            lambda: kube.custom.get_namespaced_custom_object(
                "autoscaling", "v2beta2", ns, "horizontalpodautoscalers", "ext"
            ),
            30,
            "the operator's HPA",
            log=log,
        )
        assert hpa["spec"]["scaleTargetRef"]["kind"] == "InferenceService" and hpa["spec"]["maxReplicas"] == 4
    else:
        so = wait_for_api(
            lambda: kube.custom.get_namespaced_custom_object(
                "keda.sh", "v1alpha1", ns, "scaledobjects", "ext"
            ),
            30,
            "the operator's ScaledObject",
            log=log,
        )
        assert so["spec"]["scaleTargetRef"]["name"] == "ext"
    kube.custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, ns, PLURAL, "ext", {"spec": {"replicas": 3}}
    )
    wait_scaled(kube, ns, "ext", 3, log)
