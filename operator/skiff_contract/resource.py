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
# On the Secret the operator keeps per InferenceService for the router's calls to its pods (the value:
# the InferenceService's name). Its field INTERNAL_KEY_FIELD lists the keys the pods accept, one per line,
# the current one first, then the previous one while a rotation is under way.
INTERNAL_KEY_LABEL = f"{GROUP}/internal-key"
INTERNAL_KEY_FIELD = "keys"
# Set to a new value on an InferenceService, it asks the operator for a fresh internal key.
ROTATE_KEY_ANNOTATION = f"{GROUP}/rotate-internal-key"
# The pods' named ports: the OpenAI API (the router's way in) and /metrics (the scraper's).
API_PORT_NAME, METRICS_PORT_NAME = "http", "metrics"


def internal_key_secret_name(isvc_name: str) -> str:
    return f"{isvc_name}-internal-key"


def served_name(name: str, requested: str | None) -> str:
    """The model name clients request: `spec.model.servedName` when set, else the InferenceService's name."""
    return requested or name


def isvc_served_name(isvc: Mapping[str, Any]) -> str:
    """`served_name` of an InferenceService object as the API returns it (a plain dict)."""
    model = (isvc.get("spec") or {}).get("model") or {}
    return served_name(isvc["metadata"]["name"], model.get("servedName"))
