"""A real kube-apiserver (the operator tests' control plane, tests/operator/op_kubeapi.py) with Skiff's CRDs."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))


def wait_for(check, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


@contextlib.contextmanager
def kube_api() -> Iterator:
    """An ApiClient on a fresh control plane; SKIFF_TEST_KUBECONFIG names its kubeconfig file."""
    from op_kubeapi import ControlPlane, binaries_present

    if not binaries_present():
        pytest.skip("no test kube-apiserver: run scripts/install.d/kube.sh")
    import kubernetes
    from skiff_operator.crd import crd_manifest, peering_crd_manifests

    cp = ControlPlane()
    try:
        cp.start()
        os.environ["SKIFF_TEST_KUBECONFIG"] = str(cp.kubeconfig)
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=config)
        client = kubernetes.client.ApiClient(config)
        ext = kubernetes.client.ApiextensionsV1Api(client)
        crds = [crd_manifest(), *peering_crd_manifests()]  # kopf waits for its peering CRDs
        for crd in crds:
            ext.create_custom_resource_definition(crd)
        for crd in crds:
            name = crd["metadata"]["name"]
            wait_for(
                lambda name=name: any(
                    c.type == "Established" and c.status == "True"
                    for c in ext.read_custom_resource_definition(name).status.conditions or []
                ),
                what=f"CRD {name} established",
            )
        yield client
    finally:
        cp.stop()
