"""Kubernetes discovery: InferenceServices, their EndpointSlices, and API-key Secrets.

The translation from API objects to `PoolSpec`s and `ApiKey`s is pure (tested with plain dicts); the
source around it lists the objects every `interval` seconds through the official client in a thread.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from dataclasses import dataclass

from skiff_contract import (
    API_KEY_LABEL,
    GROUP,
    INTERNAL_KEY_FIELD,
    INTERNAL_KEY_LABEL,
    ISVC_LABEL,
    PLURAL,
    VERSION,
    internal_key_secret_name,
    isvc_served_name,
)

from skiff_router.discovery import pod_keys
from skiff_router.keys import ApiKey, KeyStore
from skiff_router.registry import PoolSpec, Registry

log = logging.getLogger("skiff_router")

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
SECRET_TTL, MISSING_TTL = 30.0, 5.0  # seconds a Secret read by name is reused (found, not found)


def served_models(isvc: dict) -> tuple[str, ...]:
    return (isvc_served_name(isvc),)


def slice_addresses(endpoint_slice: dict) -> list[str]:
    """Ready "ip:port" pairs of one EndpointSlice (port named `http`, else the first one)."""
    ports = endpoint_slice.get("ports") or []
    port = next((p.get("port") for p in ports if p.get("name") == "http"), None)
    if port is None and ports:
        port = ports[0].get("port")
    if port is None:
        return []
    out = []
    for ep in endpoint_slice.get("endpoints") or []:
        conditions = ep.get("conditions") or {}
        if conditions.get("ready") is False or conditions.get("terminating") is True:
            continue
        for ip in ep.get("addresses") or []:
            out.append(f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}")
    return out


def secret_value(secret: dict, key: str) -> str | None:
    if key in (secret.get("stringData") or {}):
        return secret["stringData"][key]
    raw = (secret.get("data") or {}).get(key)
    return base64.b64decode(raw).decode().strip() if raw is not None else None


def _named_secrets(isvcs: list[dict], internal: bool) -> list[tuple[str, str]]:
    """(namespace, name) of the Secrets to read by name: each apiKeySecretRef, and with `internal` each
    service's internal-key Secret (where the router lists no Secrets in that namespace)."""
    out = []
    for isvc in isvcs:
        ns = isvc["metadata"].get("namespace", "default")
        ref = ((isvc.get("spec") or {}).get("apiKeySecretRef") or {}).get("name")
        if ref:
            out.append((ns, ref))
        elif internal:
            out.append((ns, internal_key_secret_name(isvc["metadata"]["name"])))
    return out


def secret_keys(secret: dict | None, field: str) -> tuple[str, ...]:
    """The keys in one Secret field, one per line."""
    value = secret_value(secret, field) if secret else None
    return tuple(line.strip() for line in (value or "").splitlines() if line.strip())


def pools_from_objects(isvcs: list[dict], slices: list[dict], secrets: list[dict] = ()) -> list[PoolSpec]:
    """`secrets`: at least the ones the InferenceServices' apiKeySecretRef name (their pods' key)."""
    by_name = {(s["metadata"].get("namespace", "default"), s["metadata"]["name"]): s for s in secrets}
    by_owner: dict[tuple[str, str], list[str]] = {}
    for s in slices:
        meta = s.get("metadata") or {}
        labels = meta.get("labels") or {}
        owner = labels.get(ISVC_LABEL)
        if owner:
            by_owner.setdefault((meta.get("namespace", "default"), owner), []).extend(slice_addresses(s))
    specs = []
    for isvc in isvcs:
        meta, spec = isvc["metadata"], isvc.get("spec") or {}
        namespace, name = meta.get("namespace", "default"), meta["name"]
        routing = spec.get("routing") or {}
        ref = spec.get("apiKeySecretRef") or {}
        upstream_key, upstream_keys = None, ()
        if ref.get("name"):
            upstream_keys = secret_keys(by_name.get((namespace, ref["name"])), ref.get("key", "token"))
            # a missing Secret or key: the pods reject everything anyway; the model stays key-only
            upstream_key = upstream_keys[0] if upstream_keys else "\0missing"
        else:
            internal = by_name.get((namespace, internal_key_secret_name(name)))
            if (
                internal is not None
                and (internal["metadata"].get("labels") or {}).get(INTERNAL_KEY_LABEL) == name
            ):
                upstream_keys = secret_keys(internal, INTERNAL_KEY_FIELD)
        specs.append(
            PoolSpec(
                name=name,
                namespace=namespace,
                models=served_models(isvc),
                addresses=tuple(dict.fromkeys(by_owner.get((namespace, name), []))),
                strategy=routing.get("strategy", "prefixHash"),
                prefix_chars=int(routing.get("prefixChars", 256)),
                replicas=spec.get("replicas"),
                upstream_key=upstream_key,
                upstream_keys=upstream_keys,
            )
        )
    return specs


def key_from_secret(secret: dict) -> ApiKey:
    data = secret.get("data") or {}
    fields = {k: base64.b64decode(v).decode() for k, v in data.items()}
    fields |= secret.get("stringData") or {}
    return ApiKey.from_fields(secret["metadata"]["name"], fields)


def keys_from_secrets(secrets: list[dict]) -> list[ApiKey]:
    """Client keys from the Secrets labelled `skiff.dev/api-key` (others are ignored)."""
    keys = []
    for s in secrets:
        if API_KEY_LABEL not in (s["metadata"].get("labels") or {}):
            continue
        try:
            keys.append(key_from_secret(s))
        except (ValueError, UnicodeDecodeError) as e:
            log.warning("ignoring api-key Secret %s: %s", s["metadata"]["name"], e)
    return keys


@dataclass
class KubeSource:
    """Lists InferenceServices and EndpointSlices (in `namespaces`, or all namespaces when empty) and the
    Secrets of client and pod keys (see `_list`)."""

    namespaces: tuple[str, ...] = ()
    interval: float = 2.0
    kubeconfig: str | None = None  # default: in-cluster service account, else the usual kubeconfig
    peers_service: str | None = None  # the routers' own Service: its ready endpoints divide the quotas
    peers_namespace: str = "default"
    keys_namespace: str | None = None  # watching all namespaces: client keys live here (default: peers_)

    def __post_init__(self) -> None:
        if self.keys_namespace is None:
            self.keys_namespace = self.peers_namespace
        self._secret_cache: dict[tuple[str, str], tuple[float, dict | None]] = {}
        from kubernetes import client, config

        if self.kubeconfig:
            self._api = config.new_client_from_config(config_file=self.kubeconfig)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            self._api = client.ApiClient()
        self._custom = client.CustomObjectsApi(self._api)
        self._core = client.CoreV1Api(self._api)
        self._slice_version = "v1"

    def _slices(self, namespace: str | None) -> list[dict]:
        """EndpointSlices labelled for InferenceServices: discovery.k8s.io/v1, or v1beta1 before Kubernetes 1.21."""
        from kubernetes.client.exceptions import ApiException

        while True:
            args = ("discovery.k8s.io", self._slice_version)
            try:
                if namespace:
                    out = self._custom.list_namespaced_custom_object(
                        *args, namespace, "endpointslices", label_selector=ISVC_LABEL
                    )
                else:
                    out = self._custom.list_cluster_custom_object(
                        *args, "endpointslices", label_selector=ISVC_LABEL
                    )
                return out["items"]
            except ApiException as e:
                if e.status != 404 or self._slice_version != "v1":
                    raise
                self._slice_version = "v1beta1"

    def _list(self) -> tuple[list[dict], list[dict], list[dict]]:
        """InferenceServices, their EndpointSlices, and the Secrets the router reads: client keys (labelled
        `skiff.dev/api-key`), internal keys (labelled `skiff.dev/internal-key`) and the Secrets that
        apiKeySecretRef names. Secrets are listed only in watched namespaces; watching all namespaces, the
        router lists client keys in its own namespace and reads each service's key Secret by name, so it
        never needs to list Secrets cluster-wide."""
        ser = self._api.sanitize_for_serialization
        isvcs: list[dict] = []
        slices: list = []
        secrets: list = []
        if self.namespaces:
            for ns in self.namespaces:
                isvcs += self._custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
                slices += self._slices(ns)
                for label in (API_KEY_LABEL, INTERNAL_KEY_LABEL):
                    secrets += self._core.list_namespaced_secret(ns, label_selector=label).items
        else:
            isvcs = self._custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
            slices = self._slices(None)
            secrets = self._client_key_secrets()
        secret_dicts = [ser(s) for s in secrets]
        have = {(s["metadata"].get("namespace"), s["metadata"]["name"]) for s in secret_dicts}
        for ns, name in _named_secrets(isvcs, internal=not self.namespaces):
            if (ns, name) not in have:
                secret = self._read_secret(ns, name)
                if secret is not None:
                    secret_dicts.append(secret)
                    have.add((ns, name))
        return isvcs, slices, secret_dicts

    def _client_key_secrets(self) -> list:
        """Client-key Secrets of the router's own namespace; unreadable (RBAC that leaves it out, a wrong
        $POD_NAMESPACE): none, with one warning, so models stay routable and key-only ones refuse all."""
        try:
            return self._core.list_namespaced_secret(self.keys_namespace, label_selector=API_KEY_LABEL).items
        except Exception as e:
            if not getattr(self, "_keys_warned", False):
                log.warning("cannot list client keys in namespace %s: %s", self.keys_namespace, e)
                self._keys_warned = True
            return []

    def _read_secret(self, namespace: str, name: str) -> dict | None:
        """A Secret by name, cached (a hit for SECRET_TTL seconds, a miss for MISSING_TTL)."""
        now = time.monotonic()
        cached = self._secret_cache.get((namespace, name))
        if cached is not None and cached[0] > now:
            return cached[1]
        secret = None
        try:
            secret = self._api.sanitize_for_serialization(self._core.read_namespaced_secret(name, namespace))
        except Exception as e:  # a missing Secret leaves the model key-only with no pod key
            if getattr(e, "status", None) != 404:
                log.warning("Secret %s/%s unreadable: %s", namespace, name, e)
        self._secret_cache[(namespace, name)] = (now + (SECRET_TTL if secret else MISSING_TTL), secret)
        return secret

    def _peer_count(self) -> int | None:
        """Ready router replicas: the addresses of the routers' own Service's EndpointSlices."""
        if not self.peers_service:
            return None
        try:
            out = self._custom.list_namespaced_custom_object(
                "discovery.k8s.io",
                "v1",
                self.peers_namespace,
                "endpointslices",
                label_selector=f"{SERVICE_NAME_LABEL}={self.peers_service}",
            )
        except Exception as e:  # RBAC or an old cluster: keep the configured share
            if not getattr(self, "_peers_warned", False):
                log.warning(
                    "cannot count router replicas through %s/%s (keeping --quota-replicas): %s",
                    self.peers_namespace,
                    self.peers_service,
                    e,
                )
                self._peers_warned = True
            return None
        return len({a for s in out.get("items", []) for a in slice_addresses(s)})

    async def refresh(self, registry: Registry, keys: KeyStore) -> None:
        isvcs, slices, secrets = await asyncio.to_thread(self._list)
        specs = pools_from_objects(isvcs, slices, secrets)
        registry.update(specs)
        keys.set_keys(pod_keys(specs) + keys_from_secrets(secrets))
        peers = await asyncio.to_thread(self._peer_count)
        if peers:  # 0 while this replica is not ready yet: keep the last share
            keys.set_share(peers)

    async def scale_from_zero(self, spec: PoolSpec) -> bool:
        """Set replicas 0 -> 1 through the scale subresource (the autoscaler takes it from there)."""

        def patch() -> bool:
            scale = self._custom.get_namespaced_custom_object_scale(
                GROUP, VERSION, spec.namespace, PLURAL, spec.name
            )
            if (scale.get("spec") or {}).get("replicas", 0) > 0:
                return False
            self._custom.patch_namespaced_custom_object_scale(
                GROUP, VERSION, spec.namespace, PLURAL, spec.name, {"spec": {"replicas": 1}}
            )
            return True

        try:
            return await asyncio.to_thread(patch)
        except Exception as e:
            log.warning("scale from zero of %s/%s failed: %s", spec.namespace, spec.name, e)
            return False
