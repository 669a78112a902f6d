"""Fixtures for the operator tests that need a Kubernetes API (support.kube, support.kubelet)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest
from kopf.testing import KopfRunner
from op_helpers import running_operator
from support.kube import Api, connect, control_plane, install_crds
from support.kubelet import FakeKubelet
from support.operator_rbac import install_yaml_objects, installed_operator_kubeconfig


@pytest.fixture(scope="session")
def api() -> Iterator[Api]:
    with control_plane() as cp:
        os.environ["KUBECONFIG"] = str(cp.kubeconfig)
        # read at import time by the kubernetes client (and so by kopf's login through it)
        kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(cp.kubeconfig)
        api = connect(cp.kubeconfig)
        install_crds(api)
        yield api


@pytest.fixture
def namespace(api: Api) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    api.core.create_namespace({"metadata": {"name": name}})
    yield name
    api.core.delete_namespace(name)


@pytest.fixture(scope="session")
def operator_kubeconfig(api: Api, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The operator's ServiceAccount and RBAC as manifests/install.yaml installs them; its token's kubeconfig."""
    path = tmp_path_factory.mktemp("operator") / "kubeconfig"
    return installed_operator_kubeconfig(api, install_yaml_objects(), path)


@pytest.fixture
def operator(api: Api, namespace: str, operator_kubeconfig: Path) -> Iterator[KopfRunner]:
    with running_operator(namespace, operator_kubeconfig) as runner:
        yield runner


@pytest.fixture
def kubelet(api: Api, namespace: str) -> Iterator[FakeKubelet]:
    node = FakeKubelet(api.core, namespace)
    node.start()
    yield node
    node.stop()
