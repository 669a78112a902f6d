"""Labels, owner reference and metadata of the objects an InferenceService owns (its children), and the
model name its pods serve. A leaf: the renderers of the operator and of its autoscaling package use it."""

from __future__ import annotations

from typing import Any

from skiff_contract import API_VERSION, GROUP, ISVC_LABEL, KIND
from skiff_contract import served_name as contract_served_name

from .spec import InferenceServiceSpec, parse_spec

LABEL_ISVC = ISVC_LABEL
LABEL_ROLE = f"{GROUP}/role"
LABEL_HASH = f"{GROUP}/template-hash"
FIELD_MANAGER = "skiff-operator"


def selector_labels(name: str) -> dict[str, str]:
    return {LABEL_ISVC: name, LABEL_ROLE: "main"}


def common_labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "skiff",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "server",
        "app.kubernetes.io/part-of": "skiff",
        "app.kubernetes.io/managed-by": FIELD_MANAGER,
        **selector_labels(name),
    }


def selector_string(name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(name).items()))


def served_name(isvc: dict[str, Any], spec: InferenceServiceSpec | None = None) -> str:
    spec = spec or parse_spec(isvc.get("spec"))
    return contract_served_name(isvc["metadata"]["name"], spec.model.served_name)


def owner_reference(isvc: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": isvc["metadata"]["name"],
        "uid": isvc["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(
    isvc: dict[str, Any], name: str, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """`metadata` of a child object `name`: the InferenceService's namespace, labels and owner reference."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": isvc["metadata"]["namespace"],
        "labels": common_labels(isvc["metadata"]["name"]),
        "ownerReferences": [owner_reference(isvc)],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta
