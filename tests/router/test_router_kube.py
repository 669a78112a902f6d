"""The router's Kubernetes discovery on a real kube-apiserver with its EndpointSlice controller: models from
InferenceServices, endpoints from the slices of their Services' ready pods, keys from Secrets, and scale
from zero through the InferenceService's /scale.

The test plays the kubelet: it marks pods Ready. The API refuses loopback addresses in EndpointSlices, so
the pods get documentation-range IPs (192.0.2.0/24) that nothing here ever connects to: this test checks
what the router discovers and decides; traffic through the router is tested in test_router_http.py and
test_router_serve.py."""

from __future__ import annotations

import asyncio
import base64
import threading

import httpx
import openai
import pytest
from skiff_contract import GROUP, INTERNAL_KEY_LABEL, PLURAL, VERSION
from skiff_router.app import RouterConfig, create_app
from skiff_router.kube import KubeSource
from support.asgi import ServerThread
from support.waiting import wait_for

pytestmark = pytest.mark.timeout(240)
NS = "default"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def isvc(name: str, replicas: int, **spec) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {"model": {"source": "hf://org/smol"}, "replicas": replicas, **spec},
    }


def serve_pod(core, name: str, port: int, ip: str) -> None:
    """A Service labelled for the InferenceService and one Ready pod behind it (the kubelet's part, played)."""
    labels = {"skiff.dev/inferenceservice": name}
    core.create_namespaced_service(
        NS,
        {
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "selector": {"app": name},
                "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
            },
        },
    )
    if not core.list_node(field_selector="metadata.name=node-1").items:
        core.create_node({"metadata": {"name": "node-1"}})
    core.create_namespaced_pod(
        NS,
        {
            "metadata": {"name": f"{name}-0", "labels": {"app": name}},
            "spec": {
                "automountServiceAccountToken": False,
                "nodeName": "node-1",
                "containers": [
                    {"name": "server", "image": "skiff", "ports": [{"name": "http", "containerPort": port}]}
                ],
            },
        },
    )
    core.patch_namespaced_pod_status(
        f"{name}-0",
        NS,
        {"status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}},
    )


def test_discovery_keys_and_scale_from_zero_on_a_real_api(kube):
    core, custom = kube.core, kube.custom
    core.create_namespaced_secret(
        NS, {"metadata": {"name": "smol-pod-key"}, "data": {"token": b64("sk-pod")}}
    )
    core.create_namespaced_secret(
        NS,
        {
            "metadata": {"name": "alice", "labels": {"skiff.dev/api-key": "true"}},
            "data": {"key": b64("sk-alice"), "models": b64("chat"), "rpm": b64("100")},
        },
    )
    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        NS,
        PLURAL,
        isvc(
            "smol",
            1,
            model={"source": "hf://org/smol", "servedName": "chat"},
            routing={"strategy": "leastRequests", "prefixChars": 64},
            apiKeySecretRef={"name": "smol-pod-key", "key": "token"},
        ),
    )
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, isvc("cold", 0))
    serve_pod(core, "smol", 8000, "192.0.2.10")
    source = KubeSource(namespaces=(NS,), interval=0.3, kubeconfig=kube.kubeconfig)
    app = create_app(source, RouterConfig(hold_timeout=6, retry_after=9))
    router = ServerThread(app)
    url = f"http://{router.address}"
    registry = app.state.router.registry
    try:
        wait_for(
            lambda: registry.lookup("chat") and registry.lookup("chat").endpoints,
            timeout=60,
            what="the EndpointSlice of smol's ready pod",
        )
        pool = registry.lookup("chat")
        assert [e.address for e in pool.endpoints] == ["192.0.2.10:8000"]
        assert (pool.spec.strategy, pool.spec.prefix_chars, pool.spec.upstream_key) == (
            "leastRequests",
            64,
            "sk-pod",
        )
        assert sorted(m["id"] for m in httpx.get(url + "/v1/models").json()["data"]) == ["chat", "cold"]
        alice = openai.OpenAI(base_url=url + "/v1", api_key="sk-alice", max_retries=0, timeout=30)
        assert [m.id for m in alice.models.list().data] == ["chat"]
        with pytest.raises(openai.AuthenticationError):  # the pods have a key: the model is key-only
            openai.OpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0).completions.create(
                model="chat", prompt="hi", max_tokens=1
            )
        with pytest.raises(openai.PermissionDeniedError):
            alice.completions.create(model="cold", prompt="hi", max_tokens=1)
        with pytest.raises(openai.NotFoundError):
            alice.completions.create(model="nope", prompt="hi", max_tokens=1)

        # a model at zero: the request is held, the router sets /scale to 1; no replica comes: 503 + Retry-After
        out: dict[str, httpx.Response] = {}
        t = threading.Thread(
            target=lambda: out.setdefault(
                "r", httpx.post(url + "/v1/completions", json={"model": "cold", "prompt": "wake"}, timeout=60)
            )
        )
        t.start()
        wait_for(
            lambda: (
                custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "cold")["spec"]["replicas"]
                == 1
            ),
            timeout=30,
            what="scale from zero through /scale",
        )
        t.join(timeout=30)
        assert out["r"].status_code == 503 and out["r"].headers["retry-after"] == "9"
        # the Secret changes: a rotated key is picked up, the old one stops working
        core.patch_namespaced_secret("alice", NS, {"data": {"key": b64("sk-alice-2")}})
        wait_for(lambda: app.state.router.keys.find("sk-alice-2") is not None, what="rotated key")
        assert app.state.router.keys.find("sk-alice") is None
    finally:
        router.stop()


def internal_key_secret(ns: str, name: str, keys: str) -> dict:
    return {
        "metadata": {"name": f"{name}-internal-key", "namespace": ns, "labels": {INTERNAL_KEY_LABEL: name}},
        "data": {"keys": b64(keys)},
    }


def test_internal_keys_and_secret_reads_in_both_watch_modes(kube):
    """Internal keys reach the pools (listed by label in watched namespaces; read by name when watching
    all of them), are never client keys, and client keys come only from where the router looks."""
    core, custom = kube.core, kube.custom
    for ns in ("team-x", "skiff-system"):
        core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_secret("team-x", internal_key_secret("team-x", "fronted", "sk-new\nsk-old\n"))
    custom.create_namespaced_custom_object(GROUP, VERSION, "team-x", PLURAL, isvc("fronted", 1))
    for ns, key in (("team-x", "sk-in-model-ns"), ("skiff-system", "sk-in-router-ns")):
        core.create_namespaced_secret(
            ns,
            {
                "metadata": {"name": "team", "labels": {"skiff.dev/api-key": "true"}},
                "data": {"key": b64(key)},
            },
        )
    namespaced = KubeSource(namespaces=("team-x",), kubeconfig=kube.kubeconfig)
    clusterwide = KubeSource(kubeconfig=kube.kubeconfig, peers_namespace="skiff-system")
    for source, client_key in ((namespaced, "sk-in-model-ns"), (clusterwide, "sk-in-router-ns")):
        app = create_app(source, RouterConfig())
        router = app.state.router
        asyncio.run(source.refresh(router.registry, router.keys))
        spec = router.registry.lookup("fronted").spec
        assert (spec.upstream_key, spec.upstream_keys) == (None, ("sk-new", "sk-old"))
        assert router.keys.find("sk-new") is None and router.keys.find("sk-old") is None
        assert router.keys.find(client_key) is not None
        other = ({"sk-in-model-ns", "sk-in-router-ns"} - {client_key}).pop()
        assert router.keys.find(other) is None  # a namespace this router does not read keys from
    # a rotation reaches the cluster-wide router once its cached read of the Secret expires
    core.patch_namespaced_secret("fronted-internal-key", "team-x", {"data": {"keys": b64("sk-3\nsk-new\n")}})
    clusterwide._secret_cache.clear()  # (SECRET_TTL seconds in a running router)
    router = create_app(clusterwide, RouterConfig()).state.router
    asyncio.run(clusterwide.refresh(router.registry, router.keys))
    assert router.registry.lookup("fronted").spec.upstream_keys == ("sk-3", "sk-new")
