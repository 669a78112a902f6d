"""The security story of test_1_helm_story.py (issue 27): the only way to a model with a key is the router.

The test process runs on the node and reaches the pod network (pod IPs and ClusterIPs) like any pod would.
The local cluster's CNI (the `bridge` plugin, docs/local-cluster.md) does not enforce NetworkPolicy: the
policies the chart and the operator create are checked for presence here (their selectors in
tests/delivery/test_network_policy.py), and the direct calls below reach the pods, which must refuse them
by key alone, as they must on any CNI."""

from __future__ import annotations

import base64
import time

import httpx
from e2e_helpers import API_PORT, METRICS_PORT, MODEL, StreamLoad, chat, models_status, wait_until

SYSTEM_NS = "skiff-system"
ROTATE = "skiff.dev/rotate-internal-key"


def internal_keys(cluster, ns: str, name: str) -> list[str]:
    secret = cluster.get("secret", "-n", ns, f"{name}-internal-key")
    return base64.b64decode(secret["data"]["keys"]).decode().split()


def pod_ips(cluster, ns: str, selector: str) -> list[str]:
    return [p["status"]["podIP"] for p in cluster.ready_pods(ns, selector)]


def only_the_router_gets_in(cluster, router_url: str, ns: str, selector: str) -> None:
    secret = cluster.get("secret", "-n", ns, "smollm2-internal-key")
    assert secret["metadata"]["labels"]["skiff.dev/internal-key"] == "smollm2"
    assert secret["metadata"]["ownerReferences"][0]["name"] == "smollm2"
    policy = cluster.get("networkpolicy", "-n", ns, "smollm2")  # present; not enforced by this CNI
    assert policy["spec"]["podSelector"]["matchLabels"]["skiff.dev/inferenceservice"] == "smollm2"
    cluster.get("networkpolicy", "-n", SYSTEM_NS, "skiff-router")

    service = cluster.service_url(ns, "smollm2")
    for base in [service, *(f"http://{ip}:{API_PORT}" for ip in pod_ips(cluster, ns, selector))]:
        r = httpx.post(
            f"{base}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            timeout=30,
        )
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (base, r.text)
        assert models_status(base, "EMPTY") == 401 and models_status(base, "sk-guess") == 401
    (key, *_) = internal_keys(cluster, ns, "smollm2")
    assert models_status(service, key) == 200  # what the router sends
    for ip in pod_ips(cluster, ns, selector):  # /metrics: its own port, open to the scraper; not on the API's
        assert httpx.get(f"http://{ip}:{METRICS_PORT}/metrics", timeout=10).status_code == 200
        assert httpx.get(f"http://{ip}:{API_PORT}/metrics", timeout=10).status_code == 404

    # a team key (client keys live in the router's namespace) gets through the router, with its quota
    team = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "team-e2e", "labels": {"skiff.dev/api-key": "true"}},
        "stringData": {"key": "sk-team-e2e", "models": MODEL, "rpm": "1000"},
    }
    cluster.apply(team, SYSTEM_NS)
    try:

        def team_call() -> httpx.Response | None:
            r = httpx.post(
                f"{router_url}/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4},
                headers={"Authorization": "Bearer sk-team-e2e"},
                timeout=120,
            )
            return r if "x-ratelimit-limit-requests" in r.headers else None

        r = wait_until("the router to know the team key", team_call, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        cluster.kubectl("delete", "-n", SYSTEM_NS, "secret", "team-e2e", "--ignore-not-found")


def rotation_keeps_serving(cluster, router_url: str, ns: str, selector: str) -> None:
    (old,) = internal_keys(cluster, ns, "smollm2")
    pods_before = {p["metadata"]["name"] for p in cluster.ready_pods(ns, selector)}
    service = cluster.service_url(ns, "smollm2")
    with StreamLoad(router_url, workers=2) as load:
        time.sleep(3)
        cluster.kubectl("annotate", "-n", ns, "inferenceservice/smollm2", f"{ROTATE}={time.time_ns()}")
        new, previous = wait_until(
            "the rotated Secret",
            lambda: (k := internal_keys(cluster, ns, "smollm2")) != [old] and k,
            timeout=60,
        )
        assert previous == old
        # the kubelet refreshes the mounted Secret within about a minute; meanwhile the router falls back
        wait_until("the pods to accept the new key", lambda: models_status(service, new) == 200, timeout=240)
        time.sleep(5)
    assert load.ok > 0 and load.errors == [], (load.ok, load.errors[:5])
    assert models_status(service, old) == 200  # the previous key stays valid until the next rotation
    assert {p["metadata"]["name"] for p in cluster.ready_pods(ns, selector)} == pods_before  # no restart
    cluster.report["internal_key_rotation_requests_ok"] = load.ok


def user_key_still_works(cluster, router_url: str, ns: str, service_cpu: str) -> None:
    user_secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "private-key"},
        "stringData": {"api-key": "sk-user-e2e"},
    }
    isvc = {
        "apiVersion": "skiff.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "private"},
        "spec": {
            "model": {"servedName": "private"},
            "runtime": {"dtype": "float32", "attentionBackend": "torch"},
            "resources": {"gpus": 0, "cpu": service_cpu, "memory": "4Gi", "shmSize": "1Gi"},
            "apiKeySecretRef": {"name": "private-key", "key": "api-key"},
        },
    }
    cluster.apply([user_secret, isvc], ns)
    try:
        cluster.kubectl(
            "wait",
            "-n",
            ns,
            "--for=condition=Ready",
            "inferenceservice/private",
            "--timeout=300s",
            timeout=320,
        )
        names = [s["metadata"]["name"] for s in cluster.get("secret", "-n", ns)["items"]]
        assert "private-internal-key" not in names, names  # the user's key is the pods' key
        service = cluster.service_url(ns, "private")
        assert models_status(service) == 401 and models_status(service, "sk-user-e2e") == 200
        # through the router: a key-only model, the user's key accepted as a client key
        wait_until("the router to route it", lambda: models_status(router_url, "sk-user-e2e") == 200, 60)
        answer = wait_until(
            "an answer with the user's key",
            lambda: chat(router_url, "Say hello.", model="private", api_key="sk-user-e2e"),
            timeout=120,
        )
        assert answer.strip()
        r = httpx.post(
            f"{router_url}/v1/chat/completions",
            json={"model": "private", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        assert r.status_code == 401, r.text
    finally:
        cluster.kubectl(
            "delete", "-n", ns, "inferenceservice/private", "--ignore-not-found", "--timeout=120s"
        )
        cluster.kubectl("delete", "-n", ns, "secret/private-key", "--ignore-not-found")
        wait_until(
            "the private pods gone",
            lambda: not cluster.get("pods", "-n", ns, "-l", "skiff.dev/inferenceservice=private")["items"],
            timeout=180,
        )
