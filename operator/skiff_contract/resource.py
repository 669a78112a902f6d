"""The InferenceService resource as every component addresses it: API coordinates, shared labels, the
model name clients request."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GROUP = "skiff.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"

# On every child of an InferenceService (and so on its Services' EndpointSlices): the owner's name.
ISVC_LABEL = f"{GROUP}/inferenceservice"
# On the Secrets that hold the router's client API keys.
API_KEY_LABEL = f"{GROUP}/api-key"


def served_name(name: str, requested: str | None) -> str:
    """The model name clients request: `spec.model.servedName` when set, else the InferenceService's name."""
    return requested or name


def isvc_served_name(isvc: Mapping[str, Any]) -> str:
    """`served_name` of an InferenceService object as the API returns it (a plain dict)."""
    model = (isvc.get("spec") or {}).get("model") or {}
    return served_name(isvc["metadata"]["name"], model.get("servedName"))
