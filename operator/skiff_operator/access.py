"""Who may reach an InferenceService's pods: the API key they require, and the NetworkPolicy in front of them.

The key is the user's (`spec.apiKeySecretRef`) or, when the router fronts the services and the spec names
none, an internal one the operator keeps in a Secret of its own per InferenceService (random, owned,
labelled `skiff.dev/internal-key`). Either is mounted as a file the runtime re-reads (`--api-key-file`), so a
rotation needs no restart: setting the annotation `skiff.dev/rotate-internal-key` to a new value puts a fresh
key first in the Secret and keeps the previous one second; the pods accept both, the router sends the first
and falls back to the second while the kubelet has not yet refreshed a pod's copy.

Pure functions: the handlers read the existing Secret, call `desired_internal_key`, and apply the result.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from skiff_contract import (
    API_PORT_NAME,
    GROUP,
    INTERNAL_KEY_FIELD,
    INTERNAL_KEY_LABEL,
    METRICS_PORT_NAME,
    ROTATE_KEY_ANNOTATION,
    internal_key_secret_name,
)

from .metadata import child_metadata, selector_labels
from .spec import InferenceServiceSpec

KEY_DIR = "/etc/skiff/api-key"
KEY_FILE = f"{KEY_DIR}/{INTERNAL_KEY_FIELD}"
ROTATION_ANNOTATION = f"{GROUP}/rotation"  # the rotate-annotation value the Secret's keys answer
ROTATED_AT_ANNOTATION = f"{GROUP}/rotated-at"  # seconds since the epoch of the last new key


@dataclass(frozen=True)
class NetworkPolicySettings:
    """NetworkPolicyPeers admitted to the pods' API port (the router) and to their metrics port (the
    scraper, the operator's autoscaler). The pods of the same InferenceService reach each other always."""

    api_from: tuple[dict[str, Any], ...] = ()
    metrics_from: tuple[dict[str, Any], ...] = ()

    @classmethod
    def parse(cls, text: str) -> NetworkPolicySettings:
        """`--network-policy` JSON: {"apiFrom": [peer, ...], "metricsFrom": [peer, ...]}."""
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ValueError(f"--network-policy is not JSON: {e}") from e
        if not isinstance(doc, dict) or set(doc) - {"apiFrom", "metricsFrom"}:
            raise ValueError('--network-policy must be a JSON object with "apiFrom" and "metricsFrom" lists')
        peers: dict[str, tuple[dict[str, Any], ...]] = {}
        for field in ("apiFrom", "metricsFrom"):
            value = doc.get(field) or []
            if not isinstance(value, list) or not all(isinstance(p, dict) and p for p in value):
                raise ValueError(f"--network-policy {field} must be a list of NetworkPolicyPeer objects")
            peers[field] = tuple(value)
        return cls(api_from=peers["apiFrom"], metrics_from=peers["metricsFrom"])


@dataclass(frozen=True)
class KeyMount:
    """The Secret key the pods read their accepted API keys from, mounted as KEY_FILE."""

    secret: str
    item: str

    def volume(self) -> dict[str, Any]:
        items = [{"key": self.item, "path": INTERNAL_KEY_FIELD}]
        return {
            "name": "api-key",
            "secret": {"secretName": self.secret, "items": items, "defaultMode": 0o440},
        }

    @staticmethod
    def mount() -> dict[str, Any]:
        return {"name": "api-key", "mountPath": KEY_DIR, "readOnly": True}


def key_mount(isvc: dict[str, Any], spec: InferenceServiceSpec, internal_keys: bool) -> KeyMount | None:
    if spec.api_key_secret_ref is not None:
        return KeyMount(spec.api_key_secret_ref.name, spec.api_key_secret_ref.key)
    if internal_keys:
        return KeyMount(internal_key_secret_name(isvc["metadata"]["name"]), INTERNAL_KEY_FIELD)
    return None


def wants_internal_key(spec: InferenceServiceSpec, internal_keys: bool) -> bool:
    return internal_keys and spec.api_key_secret_ref is None


@dataclass(frozen=True)
class InternalKey:
    keys: tuple[str, ...]  # the current key first, then the previous one
    rotation: str = ""  # the ROTATE_KEY_ANNOTATION value these keys answer
    rotated_at: float = 0.0


def new_key() -> str:
    return "sk-skiff-" + secrets.token_urlsafe(32)


def requested_rotation(isvc: dict[str, Any]) -> str:
    return (isvc["metadata"].get("annotations") or {}).get(ROTATE_KEY_ANNOTATION, "")


def read_internal_key(secret: dict[str, Any] | None) -> InternalKey | None:
    """The keys in an existing internal-key Secret (as the API returns it), or None if it has none."""
    if not secret:
        return None
    raw = (secret.get("data") or {}).get(INTERNAL_KEY_FIELD)
    if not raw:
        return None
    keys = tuple(k for k in base64.b64decode(raw).decode().splitlines() if k.strip())
    if not keys:
        return None
    notes = (secret.get("metadata") or {}).get("annotations") or {}
    try:
        rotated_at = float(notes.get(ROTATED_AT_ANNOTATION, "0"))
    except ValueError:
        rotated_at = 0.0
    return InternalKey(keys, notes.get(ROTATION_ANNOTATION, ""), rotated_at)


def next_internal_key(
    current: InternalKey | None,
    requested: str,
    now: float,
    min_interval: float,
    make_key: Callable[[], str] = new_key,
) -> tuple[InternalKey, float]:
    """The keys the Secret should hold, and how many seconds a requested rotation must still wait (0: none).

    A rotation keeps the previous key and drops the one before it, which a pod may still be the only key it
    knows until the kubelet refreshes its mounted copy (about a minute): so a rotation that would drop a key
    waits until `min_interval` has passed since the last one."""
    if current is None:
        return InternalKey((make_key(),), requested, now), 0.0
    if requested == current.rotation:
        return current, 0.0
    wait = current.rotated_at + min_interval - now
    if wait > 0 and len(current.keys) > 1:
        return current, wait
    return InternalKey((make_key(), current.keys[0]), requested, now), 0.0


def internal_key_secret(isvc: dict[str, Any], key: InternalKey) -> dict[str, Any]:
    name = isvc["metadata"]["name"]
    meta = child_metadata(
        isvc,
        internal_key_secret_name(name),
        {ROTATION_ANNOTATION: key.rotation, ROTATED_AT_ANNOTATION: f"{key.rotated_at:.0f}"},
    )
    meta["labels"][INTERNAL_KEY_LABEL] = name
    data = base64.b64encode(("\n".join(key.keys) + "\n").encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "data": {INTERNAL_KEY_FIELD: data},
    }


def network_policy(isvc: dict[str, Any], settings: NetworkPolicySettings) -> dict[str, Any]:
    """Ingress to the pods: the API port from `api_from`, the metrics port from `metrics_from`, every port
    from the InferenceService's own pods; nothing else (an empty peer list admits no one)."""
    name = isvc["metadata"]["name"]
    own = {"podSelector": {"matchLabels": selector_labels(name)}}
    rules: list[dict[str, Any]] = []
    for peers, port in ((settings.api_from, API_PORT_NAME), (settings.metrics_from, METRICS_PORT_NAME)):
        if peers:
            rules.append({"from": [dict(p) for p in peers], "ports": [{"protocol": "TCP", "port": port}]})
    rules.append({"from": [own]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(isvc, name),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(name)},
            "policyTypes": ["Ingress"],
            "ingress": rules,
        },
    }
