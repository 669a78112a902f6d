"""The operator's Kubernetes I/O: server-side apply of children, pruning, reads for status, status writes.
Everything here is a thin call into the `kubernetes` client; decisions live in render.py and status.py."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError
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
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
]


def load_config() -> None:
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))


def owned_by(obj: dict[str, Any], owner_uid: str) -> bool:
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(o.get("uid") == owner_uid and o.get("controller") for o in owners)


@dataclass
class Cluster:
    """One API connection with discovery cached."""

    api: kubernetes.client.ApiClient = field(default_factory=kubernetes.client.ApiClient)
    _dynamic: DynamicClient | None = None

    @property
    def dynamic(self) -> DynamicClient:
        if self._dynamic is None:
            self._dynamic = DynamicClient(self.api)
        return self._dynamic

    def resource(self, api_version: str, kind: str) -> Any | None:
        try:
            return self.dynamic.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            return None

    def serves(self, api_version: str, kind: str) -> bool:
        return self.resource(api_version, kind) is not None

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply under the operator's field manager; only the fields in `obj` are owned."""
        res = self.resource(obj["apiVersion"], obj["kind"])
        if res is None:
            raise LookupError(f"the cluster does not serve {obj['kind']} ({obj['apiVersion']})")
        meta = obj["metadata"]
        out = self.dynamic.server_side_apply(
            res,
            body=obj,
            name=meta["name"],
            namespace=meta.get("namespace"),
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
        )
        return out.to_dict()

    def prune(self, namespace: str, owner_name: str, owner_uid: str, keep: set[tuple[str, str]]) -> list[str]:
        """Delete owned children of kinds in PRUNABLE that are not in `keep` ((kind, name) pairs)."""
        removed = []
        for api_version, kind in PRUNABLE:
            res = self.resource(api_version, kind)
            if res is None:
                continue
            items = res.get(namespace=namespace, label_selector=f"{LABEL_ISVC}={owner_name}").items
            for item in items:
                if owned_by(item.to_dict(), owner_uid) and (kind, item.metadata.name) not in keep:
                    try:
                        res.delete(name=item.metadata.name, namespace=namespace)
                        removed.append(f"{kind}/{item.metadata.name}")
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
            return res.get(name=name, namespace=namespace).to_dict()
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def delete_owned(self, api_version: str, kind: str, namespace: str, name: str, owner_uid: str) -> bool:
        """Delete the object `name` if its controller is `owner_uid`; True if it was deleted."""
        obj = self.read(api_version, kind, namespace, name)
        if obj is None or not owned_by(obj, owner_uid):
            return False
        try:
            self.resource(api_version, kind).delete(name=name, namespace=namespace)
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
