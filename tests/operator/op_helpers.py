"""Shared test inputs: example CRs from manifests/examples and a CR factory."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "manifests" / "examples"
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
