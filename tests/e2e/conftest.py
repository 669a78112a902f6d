"""The end-to-end suite runs against the local single-node cluster of scripts/cluster/cluster.sh (started
here, stopped at the end): real images, pods run by a kubelet, requests through the router's Service."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from e2e_helpers import CLUSTER_SH, Cluster, write_report

CLUSTER_UP_TIMEOUT = 3000  # a fresh machine bootstraps the base image and builds every image (~16 min here)


def pytest_collection_modifyitems(items):
    e2e = [item for item in items if "tests/e2e/" in str(item.fspath)]
    for item in e2e:
        item.add_marker(pytest.mark.e2e)
    if e2e:  # the first one sets the cluster up, within pytest-timeout's limit for one test
        e2e[0].add_marker(pytest.mark.timeout(CLUSTER_UP_TIMEOUT + 900))


@pytest.fixture(scope="session")
def cluster():
    if os.environ.get("SKIFF_E2E_SKIP") == "1":
        pytest.skip("SKIFF_E2E_SKIP=1: the end-to-end cluster suite is off")
    if os.geteuid() != 0:
        pytest.skip("the end-to-end cluster needs root (containerd, kubelet, iptables)")
    t0 = time.monotonic()
    proc = subprocess.run(
        ["bash", str(CLUSTER_SH), "up"], capture_output=True, text=True, timeout=CLUSTER_UP_TIMEOUT
    )
    assert proc.returncode == 0, f"cluster.sh up failed:\n{proc.stderr[-6000:]}"
    c = Cluster(kubeconfig=proc.stdout.strip().splitlines()[-1], up_seconds=time.monotonic() - t0)
    c.report["cluster_up_seconds (images cached or built)"] = round(c.up_seconds, 1)
    c.clear_leftovers(("models", "models-plain", "skiff-system"))
    try:
        yield c
    finally:
        write_report(c)
        if os.environ.get("SKIFF_E2E_KEEP") != "1":
            subprocess.run(["bash", str(CLUSTER_SH), "down"], capture_output=True, timeout=600)
