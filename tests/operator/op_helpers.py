"""Shared inputs of the operator tests: example CRs from manifests/examples, a CR factory, and the real
operator (kopf's own runner) on one namespace."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from kopf.testing import KopfRunner
from kubernetes.config import kube_config
from support.paths import EXAMPLES

INVALID = Path(__file__).parent / "invalid"


def example_crs() -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "InferenceService":
                out[path.stem] = doc
    return out


def isvc(
    spec: dict[str, Any] | None = None,
    name: str = "demo",
    namespace: str = "ml",
    generation: int = 1,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "skiff.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace, "uid": "0000-1111", "generation": generation},
        "spec": copy.deepcopy(spec or {}),
    }
    if status is not None:
        body["status"] = status
    return body


def with_identity(cr: dict[str, Any], namespace: str = "ml") -> dict[str, Any]:
    cr = copy.deepcopy(cr)
    cr["metadata"].update(namespace=namespace, uid="0000-1111", generation=1)
    return cr


@contextlib.contextmanager
def kubeconfig_in_use(path: Path | str) -> Iterator[None]:
    """KUBECONFIG (what the operator's own client reads) and the kubernetes client's default location (what
    kopf's login reads, fixed at import) point at `path` for the block."""
    saved = os.environ.get("KUBECONFIG"), kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    os.environ["KUBECONFIG"] = kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(path)
    try:
        yield
    finally:
        if saved[0] is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = saved[0]
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = saved[1]


@contextlib.contextmanager
def running_operator(namespace: str, kubeconfig: Path | str) -> Iterator[KopfRunner]:
    """The real operator (kopf's own runner, our handlers module) watching one namespace, logged in with
    `kubeconfig` (the installed ServiceAccount's, so the installed RBAC is what it gets)."""
    from skiff_operator import handlers
    from skiff_operator.autoscaling import handlers as autoscaling_handlers

    handlers.STATE.cluster = None
    handlers.STATE.errors.clear()
    autoscaling_handlers.reset()
    args = ["run", "--standalone", "--namespace", namespace, "-m", "skiff_operator.handlers"]
    with kubeconfig_in_use(kubeconfig), KopfRunner(args, timeout=60) as runner:
        yield runner
    handlers.STATE.cluster = None
    assert runner.exit_code == 0, runner.output
    assert runner.exception is None, runner.exception
    assert "Forbidden" not in runner.output, runner.output[-4000:]
