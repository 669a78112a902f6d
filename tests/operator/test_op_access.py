"""Who may reach the pods: the internal key (rendering, rotation rules, and the real operator keeping the
Secret on a real kube-apiserver) and the per-service NetworkPolicy (schema-valid, the right selectors)."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import kubernetes_validate
import pytest
from op_helpers import isvc, running_operator
from skiff_contract import INTERNAL_KEY_LABEL, ROTATE_KEY_ANNOTATION
from skiff_operator import handlers
from skiff_operator.access import (
    InternalKey,
    NetworkPolicySettings,
    internal_key_secret,
    network_policy,
    next_internal_key,
    read_internal_key,
)
from skiff_operator.metadata import LABEL_HASH as TEMPLATE_HASH
from skiff_operator.render import OperatorSettings, desired_children
from support.kube import Api, create_isvc, patch_isvc_spec, wait_for_api

K8S_VERSIONS = ["1.29.0", "1.33.0"]
ROUTER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "skiff-system"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/component": "router"}},
}
SCRAPER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def counter() -> Iterator[str]:
    n = 0
    while True:
        n += 1
        yield f"k{n}"


def test_rotation_keeps_the_previous_key_and_waits_between_rotations() -> None:
    make = counter().__next__
    first, wait = next_internal_key(None, "", now=100.0, min_interval=300, make_key=make)
    assert (first.keys, first.rotation, wait) == (("k1",), "", 0.0)
    same, wait = next_internal_key(first, "", now=900.0, min_interval=300, make_key=make)
    assert same == first and wait == 0.0  # nothing asked: nothing changes
    second, wait = next_internal_key(first, "r1", now=150.0, min_interval=300, make_key=make)
    assert second == InternalKey(("k2", "k1"), "r1", 150.0) and wait == 0.0  # drops nothing: at once
    early, wait = next_internal_key(second, "r2", now=250.0, min_interval=300, make_key=make)
    assert early == second and wait == pytest.approx(200.0)  # k1 may be all a stale pod knows
    third, _ = next_internal_key(second, "r2", now=450.0, min_interval=300, make_key=make)
    assert third.keys == ("k3", "k2")


def test_internal_key_secret_round_trips_and_is_owned_and_labelled() -> None:
    body = isvc({}, name="chat")
    key = InternalKey(("sk-new", "sk-old"), "r7", 1234.0)
    secret = internal_key_secret(body, key)
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(secret, version, strict=True)
    assert secret["metadata"]["name"] == "chat-internal-key"
    assert secret["metadata"]["labels"][INTERNAL_KEY_LABEL] == "chat"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "0000-1111"
    assert base64.b64decode(secret["data"]["keys"]).decode() == "sk-new\nsk-old\n"
    assert read_internal_key(secret) == key
    assert read_internal_key(None) is None and read_internal_key({"data": {}}) is None


def test_fronted_pods_mount_the_internal_key() -> None:
    children = desired_children(isvc({}, name="chat"), OperatorSettings(internal_api_keys=True))
    pod = next(c for c in children if c["kind"] == "Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "api-key")
    assert volume["secret"]["secretName"] == "chat-internal-key"
    assert volume["secret"]["items"] == [{"key": "keys", "path": "keys"}]
    cmd = pod["containers"][0]["command"]
    assert cmd[cmd.index("--api-key-file") + 1] == "/etc/skiff/api-key/keys"
    assert not any(c["kind"] == "Secret" for c in children)  # the handler keeps it (it holds state)


def test_network_policy_admits_the_router_the_scraper_and_the_services_own_pods() -> None:
    settings = NetworkPolicySettings(api_from=(ROUTER,), metrics_from=(SCRAPER,))
    policy = network_policy(isvc({}, name="chat"), settings)
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(policy, version, strict=True)
    own = {"skiff.dev/inferenceservice": "chat", "skiff.dev/role": "main"}
    assert policy["spec"]["podSelector"] == {"matchLabels": own}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    api, metrics, peers = policy["spec"]["ingress"]
    assert api == {"from": [ROUTER], "ports": [{"protocol": "TCP", "port": "http"}]}
    assert metrics == {"from": [SCRAPER], "ports": [{"protocol": "TCP", "port": "metrics"}]}
    assert peers == {"from": [{"podSelector": {"matchLabels": own}}]}  # every port: tensor-parallel peers
    dep = next(c for c in desired_children(isvc({}, name="chat")) if c["kind"] == "Deployment")
    assert own.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    closed = network_policy(isvc({}, name="chat"), NetworkPolicySettings())
    assert closed["spec"]["ingress"] == [peers]  # no peers configured: only the service's own pods


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ("[]", "JSON object"),
        ('{"apiFrom": [], "other": []}', "JSON object"),
        ('{"apiFrom": {"podSelector": {}}}', "list of NetworkPolicyPeer"),
        ('{"metricsFrom": [{}]}', "list of NetworkPolicyPeer"),
    ],
)
def test_bad_network_policy_settings_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NetworkPolicySettings.parse(text)
    parsed = NetworkPolicySettings.parse(f'{{"apiFrom": [{ROUTER!r}]}}'.replace("'", '"'))
    assert parsed.api_from == (ROUTER,) and parsed.metrics_from == ()


@contextlib.contextmanager
def fronted_operator(namespace: str, kubeconfig: Path, min_interval: float) -> Iterator[None]:
    saved = handlers.STATE.settings
    handlers.STATE.settings = dataclasses.replace(
        saved,
        internal_api_keys=True,
        key_rotation_min_seconds=min_interval,
        network_policy=NetworkPolicySettings(api_from=(ROUTER,), metrics_from=(SCRAPER,)),
    )
    handlers.STATE.rotations.clear()
    try:
        with running_operator(namespace, kubeconfig):
            yield
    finally:
        handlers.STATE.settings = saved


def keys_of(api: Api, ns: str, name: str) -> list[str] | None:
    secret = api.core.read_namespaced_secret(f"{name}-internal-key", ns)
    return base64.b64decode(secret.data["keys"]).decode().split()


def annotate(api: Api, ns: str, name: str, value: str) -> None:
    patch = {"metadata": {"annotations": {ROTATE_KEY_ANNOTATION: value}}}
    api.custom.patch_namespaced_custom_object("skiff.dev", "v1alpha1", ns, "inferenceservices", name, patch)


@pytest.mark.timeout(240)
def test_operator_keeps_rotates_and_removes_the_internal_key(
    api: Api, namespace: str, operator_kubeconfig: Path
) -> None:
    ns = namespace
    with fronted_operator(ns, operator_kubeconfig, min_interval=6.0):
        create_isvc(api, ns, "chat", {"resources": {"gpus": 0}})
        (first,) = wait_for_api(lambda: keys_of(api, ns, "chat"), 60, "the internal-key Secret")
        secret = api.core.read_namespaced_secret("chat-internal-key", ns)
        assert secret.metadata.owner_references[0].name == "chat"
        assert secret.metadata.labels[INTERNAL_KEY_LABEL] == "chat" and first.startswith("sk-skiff-")
        dep = wait_for_api(lambda: api.apps.read_namespaced_deployment("chat", ns), 30, "the Deployment")
        volumes = {v.name: v for v in dep.spec.template.spec.volumes}
        assert volumes["api-key"].secret.secret_name == "chat-internal-key"
        networking = kubernetes.client.NetworkingV1Api(api.client)
        policy = wait_for_api(
            lambda: networking.read_namespaced_network_policy("chat", ns), 30, "the NetworkPolicy"
        )
        assert api.client.sanitize_for_serialization(policy.spec.ingress[0])["from"] == [ROUTER]

        # a rotation: the new key first, the previous one kept; the pod template is untouched
        annotate(api, ns, "chat", "1")
        rotated = wait_for_api(
            lambda: (k := keys_of(api, ns, "chat")) != [first] and k, 30, "the rotated Secret"
        )
        assert len(rotated) == 2 and rotated[1] == first
        t_rotated = time.monotonic()
        # a second one at once waits for the minimum interval, then happens
        annotate(api, ns, "chat", "2")
        time.sleep(2)
        assert keys_of(api, ns, "chat") == rotated
        again = wait_for_api(
            lambda: (k := keys_of(api, ns, "chat")) != rotated and k, 30, "the deferred rotation"
        )
        assert again[1] == rotated[0] and time.monotonic() - t_rotated >= 5
        hash_now = api.apps.read_namespaced_deployment("chat", ns).metadata.annotations[TEMPLATE_HASH]
        assert hash_now == dep.metadata.annotations[TEMPLATE_HASH]  # no rollout for a rotation

        # the user names a key: the internal one goes, the pods mount the user's Secret
        api.core.create_namespaced_secret(
            ns, {"metadata": {"name": "mine"}, "stringData": {"token": "sk-me"}}
        )
        patch_isvc_spec(api, ns, "chat", {"apiKeySecretRef": {"name": "mine"}})
        wait_for_api(
            lambda: not api.core.list_namespaced_secret(ns, label_selector=INTERNAL_KEY_LABEL).items,
            30,
            "the internal key removed",
        )
        dep = api.apps.read_namespaced_deployment("chat", ns)
        volumes = {v.name: v for v in dep.spec.template.spec.volumes}
        assert volumes["api-key"].secret.secret_name == "mine"
