"""API keys and quotas with a fake clock; Kubernetes objects -> pools and keys; the registry's merging."""

from __future__ import annotations

import base64

import pytest
from skiff_router.keys import ApiKey, AuthError, KeyStore, authorize
from skiff_router.kube import keys_from_secrets, pools_from_objects, slice_addresses
from skiff_router.registry import PoolSpec, Registry


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def store_with(*keys: ApiKey) -> tuple[KeyStore, Clock]:
    clock = Clock()
    store = KeyStore(clock)
    store.set_keys(list(keys))
    return store, clock


def test_rpm_window_slides():
    store, clock = store_with(ApiKey("a", "sk-a", rpm=2))
    for _ in range(2):
        authorize(store, "Bearer sk-a", "m", required=True)
    with pytest.raises(AuthError) as e:
        authorize(store, "Bearer sk-a", "m", required=True)
    assert e.value.status == 429 and e.value.headers["Retry-After"] == "60"
    clock.t += 30
    with pytest.raises(AuthError):
        authorize(store, "Bearer sk-a", "m", required=True)
    clock.t += 30.5  # the first two requests left the window
    _, headers = authorize(store, "Bearer sk-a", "m", required=True)
    assert headers["x-ratelimit-remaining-requests"] == "1"


def test_tpm_counts_charged_usage():
    store, clock = store_with(ApiKey("a", "sk-a", tpm=100))
    key, headers = authorize(store, "Bearer sk-a", "m", required=True)
    assert headers["x-ratelimit-remaining-tokens"] == "100"
    store.charge(key, 60)
    clock.t += 10
    store.charge(key, 50)
    with pytest.raises(AuthError) as e:
        authorize(store, "Bearer sk-a", "m", required=True)
    assert e.value.status == 429 and e.value.headers["x-ratelimit-remaining-tokens"] == "0"
    assert e.value.headers["Retry-After"] == "50"  # when the first charge leaves the window
    clock.t += 51
    _, headers = authorize(store, "Bearer sk-a", "m", required=True)
    assert headers["x-ratelimit-remaining-tokens"] == "50"


@pytest.mark.parametrize(
    "header,required,status",
    [
        (None, True, 401),
        ("Basic abc", False, 401),
        ("Bearer", True, 401),
        ("Bearer nope", True, 401),
        ("Bearer sk-a", True, 403),
    ],
)
def test_refusals(header, required, status):
    store, _ = store_with(ApiKey("a", "sk-a", models=frozenset({"other"})))
    with pytest.raises(AuthError) as e:
        authorize(store, header, "m", required=required)
    assert e.value.status == status


def test_open_model_accepts_anonymous_and_placeholder_keys():
    store, _ = store_with(ApiKey("a", "sk-a"))
    assert authorize(store, None, "m", required=False) == (None, {})
    assert authorize(store, "Bearer EMPTY", "m", required=False) == (None, {})


def test_key_fields_are_validated():
    assert ApiKey.from_fields("k", {"key": "s", "models": "a, b", "rpm": "5"}) == ApiKey(
        "k", "s", frozenset({"a", "b"}), 5, None
    )
    for bad in ({"models": "*"}, {"key": "s", "rpm": "-1"}, {"key": "s", "tpm": "lots"}):
        with pytest.raises(ValueError):
            ApiKey.from_fields("k", bad)


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def test_kubernetes_objects_to_pools_and_keys():
    isvcs = [
        {
            "metadata": {"name": "smol", "namespace": "ml"},
            "spec": {
                "model": {"servedName": "smol-chat"},
                "routing": {"strategy": "leastRequests", "prefixChars": 64},
                "replicas": 0,
                "apiKeySecretRef": {"name": "smol-pod-key", "key": "token"},
            },
        },
        {"metadata": {"name": "big", "namespace": "ml"}, "spec": {}},
    ]
    slices = [
        {
            "metadata": {"namespace": "ml", "labels": {"skiff.dev/inferenceservice": "big"}},
            "ports": [{"name": "http", "port": 8000}],
            "endpoints": [
                {"addresses": ["10.1.0.5"], "conditions": {"ready": True}},
                {"addresses": ["10.1.0.6"], "conditions": {"ready": False}},
                {"addresses": ["10.1.0.7"], "conditions": {"ready": True, "terminating": True}},
                {"addresses": ["fd00::1"]},
            ],
        },
        # the headless Service's slice lists the same pods: deduplicated
        {
            "metadata": {"namespace": "ml", "labels": {"skiff.dev/inferenceservice": "big"}},
            "ports": [{"name": "http", "port": 8000}],
            "endpoints": [{"addresses": ["10.1.0.5"]}],
        },
        {
            "metadata": {"namespace": "other", "labels": {"skiff.dev/inferenceservice": "big"}},
            "ports": [{"port": 9}],
            "endpoints": [{"addresses": ["10.9.9.9"]}],
        },
    ]
    secrets = [
        {"metadata": {"name": "smol-pod-key", "namespace": "ml"}, "data": {"token": b64("sk-pod\n")}},
        {
            "metadata": {"name": "alice", "namespace": "ml", "labels": {"skiff.dev/api-key": "true"}},
            "data": {"key": b64("sk-alice"), "models": b64("smol-chat"), "tpm": b64("1000")},
        },
        {"metadata": {"name": "broken", "namespace": "ml", "labels": {"skiff.dev/api-key": ""}}, "data": {}},
    ]
    smol, big = pools_from_objects(isvcs, slices, secrets)
    assert smol == PoolSpec("smol", "ml", ("smol-chat",), (), "leastRequests", 64, 0, "sk-pod")
    assert big.models == ("big",) and big.addresses == ("10.1.0.5:8000", "[fd00::1]:8000")
    assert big.strategy == "prefixHash" and big.upstream_key is None
    assert keys_from_secrets(secrets) == [ApiKey("alice", "sk-alice", frozenset({"smol-chat"}), None, 1000)]
    assert slice_addresses({"ports": [], "endpoints": [{"addresses": ["1.2.3.4"]}]}) == []


def test_registry_keeps_endpoint_state_across_updates():
    reg = Registry()
    reg.update([PoolSpec("a", "ns", ("m",), ("h1:1", "h2:1"))])
    pool = reg.lookup("m")
    pool.endpoints[0].inflight = 3
    assert pool.ready.is_set()
    reg.update([PoolSpec("a", "ns", ("m", "m2"), ("h1:1",))])
    assert reg.lookup("m2") is pool and pool.endpoints[0].inflight == 3
    reg.update([PoolSpec("a", "ns", ("m",), ())])
    assert not pool.ready.is_set()
    reg.update([])
    assert reg.lookup("m") is None and pool.ready.is_set()  # held requests wake up and see the removal


def test_replicas_share_each_limit():
    """Three router replicas behind one Service: together they admit the key's rpm, not three times it."""
    clock = Clock()
    replicas = [KeyStore(clock, share=3) for _ in range(3)]
    for r in replicas:
        r.set_keys([ApiKey("a", "sk-a", rpm=7, tpm=1000)])
    admitted = 0
    for i in range(12):  # the Service spreads requests over the replicas
        try:
            _, headers = authorize(replicas[i % 3], "Bearer sk-a", "m", required=True)
            admitted += 1
        except AuthError as e:
            assert e.status == 429
    assert admitted == 9  # ceil(7 / 3) = 3 per replica: within one replica's share of the limit
    assert headers["x-ratelimit-limit-requests"] == "3" and headers["x-ratelimit-limit-tokens"] == "334"
    replicas[0].set_share(1)  # a lone replica again: the whole limit
    _, headers = authorize(replicas[0], "Bearer sk-a", "m", required=True)
    assert headers["x-ratelimit-limit-requests"] == "7" and headers["x-ratelimit-remaining-requests"] == "3"


def test_router_counts_its_ready_peers():
    from skiff_router.kube import KubeSource

    def slice_(*ready: bool) -> dict:
        return {
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": [
                {"addresses": [f"10.0.0.{i}"], "conditions": {"ready": r}} for i, r in enumerate(ready)
            ],
        }

    class Custom:
        def list_namespaced_custom_object(self, group, version, namespace, plural, label_selector):
            assert (group, plural, namespace) == ("discovery.k8s.io", "endpointslices", "skiff-system")
            assert label_selector == "kubernetes.io/service-name=skiff-router"
            return {"items": [slice_(True, True, False)]}

    source = object.__new__(KubeSource)
    source.peers_service, source.peers_namespace, source._custom = "skiff-router", "skiff-system", Custom()
    assert source._peer_count() == 2
    source.peers_service = None
    assert source._peer_count() is None
