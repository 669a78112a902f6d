"""Fixtures for the operator tests that need a Kubernetes API (see op_kubeapi.py)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kubernetes
import pytest
from kopf.testing import KopfRunner
from op_kubeapi import ControlPlane, FakeKubelet, binaries_present
from skiff_operator.crd import crd_manifest, peering_crd_manifests


@dataclass
class Api:
    client: kubernetes.client.ApiClient
    core: kubernetes.client.CoreV1Api
    apps: kubernetes.client.AppsV1Api
    custom: kubernetes.client.CustomObjectsApi
    kubeconfig: str


def wait_for(check, timeout: float = 30.0, what: str = "condition", interval: float = 0.2):
    """Poll `check()` until it returns a truthy value; fail with the last value seen."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except kubernetes.client.exceptions.ApiException as e:
            if e.status != 404:
                raise
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    if not binaries_present():
        pytest.skip(
            "no test kube-apiserver: run scripts/install.d/kube.sh (SKIFF_KUBE_SKIP was set or it failed)"
        )
    cp = ControlPlane()
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def api(control_plane: ControlPlane) -> Api:
    os.environ["KUBECONFIG"] = str(control_plane.kubeconfig)
    # read at import time by the kubernetes client (and so by kopf's login through it)
    kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(control_plane.kubeconfig)
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(control_plane.kubeconfig), client_configuration=config)
    client = kubernetes.client.ApiClient(config)
    ext = kubernetes.client.ApiextensionsV1Api(client)
    for crd in [crd_manifest(), *peering_crd_manifests()]:
        ext.create_custom_resource_definition(crd)
    for crd in [crd_manifest(), *peering_crd_manifests()]:
        name = crd["metadata"]["name"]
        wait_for(
            lambda name=name: any(
                c.type == "Established" and c.status == "True"
                for c in ext.read_custom_resource_definition(name).status.conditions or []
            ),
            what=f"CRD {name} established",
        )
    return Api(
        client,
        kubernetes.client.CoreV1Api(client),
        kubernetes.client.AppsV1Api(client),
        kubernetes.client.CustomObjectsApi(client),
        str(control_plane.kubeconfig),
    )


@pytest.fixture
def namespace(api: Api) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    api.core.create_namespace({"metadata": {"name": name}})
    yield name
    api.core.delete_namespace(name)


@contextlib.contextmanager
def running_operator(namespace: str) -> Iterator[KopfRunner]:
    """The real operator (kopf's own runner, our handlers module) watching one namespace."""
    from skiff_operator import handlers

    handlers.STATE.cluster = None
    handlers.STATE.errors.clear()
    args = ["run", "--standalone", "--namespace", namespace, "-m", "skiff_operator.handlers"]
    with KopfRunner(args, timeout=60) as runner:
        yield runner
    assert runner.exit_code == 0, runner.output
    assert runner.exception is None, runner.exception


@pytest.fixture
def operator(api: Api, namespace: str) -> Iterator[KopfRunner]:
    with running_operator(namespace) as runner:
        yield runner


@pytest.fixture
def kubelet(api: Api, namespace: str) -> Iterator[FakeKubelet]:
    node = FakeKubelet(api.core, namespace)
    node.start()
    yield node
    node.stop()
