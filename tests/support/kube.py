"""Kubernetes API clients on the test control plane (support.kube_apiserver), with Skiff's CRDs installed,
and what a 1.20 API server cannot hold taken out of the chart."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import kubernetes
import pytest
import yaml
from skiff_contract import GROUP, PLURAL, VERSION

from support.kube_apiserver import ControlPlane, binaries_present
from support.paths import CHART
from support.waiting import wait_for

T = TypeVar("T")
NO_KUBE = "no test kube-apiserver: run scripts/install.d/kube.sh"


@dataclass
class Api:
    client: kubernetes.client.ApiClient
    core: kubernetes.client.CoreV1Api
    apps: kubernetes.client.AppsV1Api
    custom: kubernetes.client.CustomObjectsApi
    ext: kubernetes.client.ApiextensionsV1Api
    kubeconfig: str


def connect(kubeconfig: Path | str) -> Api:
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(kubeconfig), client_configuration=config)
    client = kubernetes.client.ApiClient(config)
    return Api(
        client,
        kubernetes.client.CoreV1Api(client),
        kubernetes.client.AppsV1Api(client),
        kubernetes.client.CustomObjectsApi(client),
        kubernetes.client.ApiextensionsV1Api(client),
        str(kubeconfig),
    )


def missing_as_none(read: Callable[[], T]) -> T | None:
    """`read()`, or None where the API server answers 404."""
    try:
        return read()
    except kubernetes.client.ApiException as e:
        if e.status == 404:
            return None
        raise


def wait_for_api(check: Callable[[], T], timeout: float = 30.0, what: str = "condition", **options: Any) -> T:
    """support.waiting.wait_for (and its options), where a 404 from the API server counts as "not yet"."""
    return wait_for(lambda: missing_as_none(check), timeout, what, **options)  # type: ignore[return-value]


def crd_established(ext: kubernetes.client.ApiextensionsV1Api, name: str) -> bool:
    conditions = ext.read_custom_resource_definition(name).status.conditions or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def install_crds(api: Api) -> None:
    """The InferenceService CRD and kopf's peering CRDs (kopf waits for those), established."""
    from skiff_operator.crd import crd_manifest, peering_crd_manifests

    crds = [crd_manifest(), *peering_crd_manifests()]
    for crd in crds:
        api.ext.create_custom_resource_definition(crd)
    for crd in crds:
        name = crd["metadata"]["name"]
        wait_for(lambda name=name: crd_established(api.ext, name), what=f"CRD {name} established")


@contextlib.contextmanager
def control_plane() -> Iterator[ControlPlane]:
    """A fresh control plane for the block; the test is skipped where the binaries are not built."""
    if not binaries_present():
        pytest.skip(NO_KUBE)
    cp = ControlPlane()
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()


@contextlib.contextmanager
def kube_api() -> Iterator[Api]:
    """Clients of a fresh control plane with Skiff's CRDs."""
    with control_plane() as cp:
        api = connect(cp.kubeconfig)
        install_crds(api)
        yield api


def strip_for_old_servers(node: Any) -> None:
    """Drops, in place, what Kubernetes 1.20 cannot store: CEL rules, and "" defaults (kept as null)."""
    if isinstance(node, dict):
        node.pop("x-kubernetes-validations", None)
        if node.get("default") == "":
            node.pop("default")
        for v in node.values():
            strip_for_old_servers(v)
    elif isinstance(node, list):
        for v in node:
            strip_for_old_servers(v)


def chart_for_test_server(tmp: Path) -> Path:
    """A copy of the chart that a 1.20 server takes: no kubeVersion claim, its CRDs stripped."""
    copy = tmp / "skiff"
    shutil.copytree(CHART, copy)
    meta = yaml.safe_load((copy / "Chart.yaml").read_text())
    meta.pop("kubeVersion")
    (copy / "Chart.yaml").write_text(yaml.safe_dump(meta))
    for f in (copy / "files" / "crds").glob("*.yaml"):
        crd = yaml.safe_load(f.read_text())
        strip_for_old_servers(crd)
        f.write_text(yaml.safe_dump(crd))
    return copy


def create_isvc(api: Api, ns: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": spec,
    }
    return api.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)


def get_isvc(api: Api, ns: str, name: str) -> dict[str, Any]:
    return api.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)


def patch_isvc_spec(api: Api, ns: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return api.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, {"spec": spec})


def create_user_hpa(api: Api, ns: str, name: str, target: str, min_replicas: int, max_replicas: int) -> None:
    """A user's own HorizontalPodAutoscaler on an InferenceService (which Skiff's autoscaler must not fight)."""
    target_ref = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService", "name": target}
    spec = {"scaleTargetRef": target_ref, "minReplicas": min_replicas, "maxReplicas": max_replicas}
    hpa = kubernetes.client.AutoscalingV1Api(api.client)
    hpa.create_namespaced_horizontal_pod_autoscaler(ns, {"metadata": {"name": name}, "spec": spec})
