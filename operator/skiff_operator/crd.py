"""The InferenceService CustomResourceDefinition (and kopf's peering CRDs), built from spec.py."""

from __future__ import annotations

from typing import Any

from skiff_contract import GROUP, KIND, PLURAL, SINGULAR, VERSION

from .schema import structural_schema
from .spec import InferenceServiceSpec, InferenceServiceStatus

SHORT_NAMES = ["sksvc"]  # not `isvc`: KServe and OME both use it
CATEGORIES = ["skiff", "ai"]

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Model", "type": "string", "jsonPath": ".status.servedModel"},
    {"name": "TP", "type": "integer", "jsonPath": ".spec.runtime.tensorParallel"},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
        "priority": 1,
    },
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Available", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "URL", "type": "string", "jsonPath": ".status.url"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _without_defaults(node: Any) -> Any:
    """Status is written by the operator only; defaults there would be meaningless (and 1.20 rejects "")."""
    if isinstance(node, dict):
        return {k: _without_defaults(v) for k, v in node.items() if k != "default"}
    if isinstance(node, list):
        return [_without_defaults(v) for v in node]
    return node


def spec_schema() -> dict[str, Any]:
    return structural_schema(InferenceServiceSpec)


def crd_manifest() -> dict[str, Any]:
    """The CRD `inferenceservices.skiff.dev`, ready for `kubectl apply`."""
    schema = {
        "type": "object",
        "description": "An LLM served by Skiff pods behind an in-cluster OpenAI endpoint.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {**spec_schema(), "default": {}},
            "status": _without_defaults(structural_schema(InferenceServiceStatus)),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "skiff", "app.kubernetes.io/part-of": "skiff"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": CATEGORIES,
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def _peering_crd(kind: str, plural: str, scope: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kopf.dev"},
        "spec": {
            "group": "kopf.dev",
            "scope": scope,
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                            },
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


def peering_crd_manifests() -> list[dict[str, Any]]:
    """kopf's peering CRDs, needed when several operator replicas run (`--peering`)."""
    return [
        _peering_crd("ClusterKopfPeering", "clusterkopfpeerings", "Cluster"),
        _peering_crd("KopfPeering", "kopfpeerings", "Namespaced"),
    ]
