"""The operator's Kubernetes I/O: server-side apply of children, pruning, reads for status, status writes.
Everything here is a thin call into the `kubernetes` client; decisions live in render.py and status.py."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException
from skiff_contract import GROUP, PLURAL, VERSION

from .metadata import FIELD_MANAGER, LABEL_ISVC

log = logging.getLogger("skiff_operator")

# Kinds the operator may have created and removes when no longer desired (the Deployment is never pruned:
# its name is fixed). Kinds the cluster does not serve are skipped.
PRUNABLE: list[tuple[str, str]] = [
    ("v1", "Service"),
    ("v1", "PersistentVolumeClaim"),
    ("policy/v1", "PodDisruptionBudget"),
    ("policy/v1beta1", "PodDisruptionBudget"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"),
    ("autoscaling/v2beta2", "HorizontalPodAutoscaler"),
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
]
REQUEST_TIMEOUT = 30.0
RETRY_MISSING_SECONDS = 30.0  # a group-version not served (KEDA not installed yet) is asked again after this


def load_config() -> None:
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))


def call(
    api: kubernetes.client.ApiClient,
    path: str,
    method: str,
    query_params: list[tuple[str, str]] | None = None,
    header_params: dict[str, str] | None = None,
    body: Any = None,
) -> Any:
    """One request by path; the decoded JSON answer. Raises ApiException on a non-2xx status."""
    headers = {"Accept": "application/json", "Content-Type": "application/json", **(header_params or {})}
    request = api.param_serialize(
        method,
        path,
        query_params=query_params or [],
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*request, _request_timeout=REQUEST_TIMEOUT)
    response.read()
    if not 200 <= response.status <= 299:
        api.response_deserialize(response, {})  # raises the ApiException of that status
    return json.loads(response.data or b"null")


@dataclass(frozen=True)
class ApiResource:
    api_version: str
    kind: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None, name: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        ns = f"/namespaces/{namespace}" if self.namespaced and namespace else ""
        return f"{base}{ns}/{self.plural}" + (f"/{name}" if name else "")


@dataclass
class Discovery:
    """Kinds served per group-version, asked once per group-version and shared by every handler thread.
    (The kubernetes dynamic client's lazy discovery cache is not safe under concurrent reconciles: its
    half-filled cache raised KeyError 'resources'/'apis'.)"""

    api: kubernetes.client.ApiClient
    _served: dict[str, tuple[float, dict[str, ApiResource]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _fetch(self, api_version: str) -> dict[str, ApiResource]:
        path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        try:
            listing = call(self.api, path, "GET")
        except ApiException as e:
            if e.status == 404:
                return {}
            raise
        return {
            r["kind"]: ApiResource(api_version, r["kind"], r["name"], bool(r.get("namespaced")))
            for r in listing.get("resources", [])
            if "/" not in r["name"]
        }

    def resource(self, api_version: str, kind: str) -> ApiResource | None:
        with self._lock:
            seen = self._served.get(api_version)
            if seen is None or (not seen[1] and time.monotonic() - seen[0] > RETRY_MISSING_SECONDS):
                seen = (time.monotonic(), self._fetch(api_version))
                self._served[api_version] = seen
            return seen[1].get(kind)


def owned_by(obj: dict[str, Any], owner_uid: str) -> bool:
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(o.get("uid") == owner_uid and o.get("controller") for o in owners)


@dataclass
class Cluster:
    """One API connection with discovery cached."""

    api: kubernetes.client.ApiClient = field(default_factory=kubernetes.client.ApiClient)
    discovery: Discovery = field(init=False)

    def __post_init__(self) -> None:
        self.discovery = Discovery(self.api)

    def _call(self, path: str, method: str, **kwargs: Any) -> Any:
        return call(self.api, path, method, **kwargs)

    def resource(self, api_version: str, kind: str) -> ApiResource | None:
        return self.discovery.resource(api_version, kind)

    def serves(self, api_version: str, kind: str) -> bool:
        return self.resource(api_version, kind) is not None

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply under the operator's field manager; only the fields in `obj` are owned."""
        res = self.resource(obj["apiVersion"], obj["kind"])
        if res is None:
            raise LookupError(f"the cluster does not serve {obj['kind']} ({obj['apiVersion']})")
        meta = obj["metadata"]
        return self._call(
            res.path(meta.get("namespace"), meta["name"]),
            "PATCH",
            query_params=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
            body=obj,
        )

    def prune(self, namespace: str, owner_name: str, owner_uid: str, keep: set[tuple[str, str]]) -> list[str]:
        """Delete owned children of kinds in PRUNABLE that are not in `keep` ((kind, name) pairs)."""
        removed = []
        for api_version, kind in PRUNABLE:
            res = self.resource(api_version, kind)
            if res is None:
                continue
            listing = self._call(
                res.path(namespace), "GET", query_params=[("labelSelector", f"{LABEL_ISVC}={owner_name}")]
            )
            for item in listing.get("items", []):
                meta = item["metadata"]
                if owned_by(item, owner_uid) and (kind, meta["name"]) not in keep:
                    try:
                        self._call(res.path(namespace, meta["name"]), "DELETE")
                        removed.append(f"{kind}/{meta['name']}")
                    except ApiException as e:
                        if e.status != 404:
                            raise
        return removed

    def read(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One object by name (a get, never a list: the operator may not list Secrets), or None."""
        res = self.resource(api_version, kind)
        if res is None:
            raise LookupError(f"the cluster does not serve {kind} ({api_version})")
        try:
            return self._call(res.path(namespace, name), "GET")
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def delete_owned(self, api_version: str, kind: str, namespace: str, name: str, owner_uid: str) -> bool:
        """Delete the object `name` if its controller is `owner_uid`; True if it was deleted."""
        obj = self.read(api_version, kind, namespace, name)
        if obj is None or not owned_by(obj, owner_uid):
            return False
        res = self.resource(api_version, kind)
        assert res is not None  # read() found the kind served
        try:
            self._call(res.path(namespace, name), "DELETE")
        except ApiException as e:
            if e.status != 404:
                raise
        return True

    def get_isvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        api = kubernetes.client.CustomObjectsApi(self.api)
        try:
            return api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def observe(self, namespace: str, name: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The Deployment named `name` and the pods of the InferenceService, as plain dicts."""
        apps = kubernetes.client.AppsV1Api(self.api)
        core = kubernetes.client.CoreV1Api(self.api)
        try:
            dep = self.api.sanitize_for_serialization(apps.read_namespaced_deployment(name, namespace))
        except ApiException as e:
            if e.status != 404:
                raise
            dep = None
        pods = core.list_namespaced_pod(namespace, label_selector=f"{LABEL_ISVC}={name}")
        return dep, [self.api.sanitize_for_serialization(p) for p in pods.items]

    def write_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        api = kubernetes.client.CustomObjectsApi(self.api)
        api.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, {"status": status})
