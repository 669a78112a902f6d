"""A real kube-apiserver for the autoscaler loop test (the operator tests' control plane, op_kubeapi.py)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))


def wait_for(check, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


@pytest.fixture(scope="module")
def kube() -> Iterator:
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
        for crd in [crd_manifest(), *peering_crd_manifests()]:  # kopf waits for its peering CRDs
            ext.create_custom_resource_definition(crd)
        for crd in [crd_manifest(), *peering_crd_manifests()]:
            name = crd["metadata"]["name"]
            wait_for(lambda name=name: any(c.type == "Established" and c.status == "True" for c in
                                           ext.read_custom_resource_definition(name).status.conditions or []),
                     what=f"CRD {name} established")
        yield client
    finally:
        cp.stop()
