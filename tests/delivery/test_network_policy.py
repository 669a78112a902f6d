"""The chart's NetworkPolicies as real Helm renders them: the router's (in the chart) and the model pods'
(rendered by the operator from the --network-policy the chart passes it), valid against the Kubernetes
schemas and selecting the pods they mean to. Whether a policy is enforced is the CNI's business: the e2e
test cluster's bridge CNI enforces none (docs/local-cluster.md), so the selectors are checked here."""

from __future__ import annotations

import kubernetes_validate
import pytest
from delivery_helpers import claimed_versions, find, renderer
from skiff_operator.access import NetworkPolicySettings, network_policy
from skiff_operator.render import OperatorSettings, desired_children

RELEASE_NS = "skiff-system"


def objects(values: dict) -> list[dict]:
    return [o for v in renderer.render(values).values() for o in v]


def args_of(objs: list[dict], name: str) -> list[str]:
    (dep,) = find(objs, "Deployment", name)
    return dep["spec"]["template"]["spec"]["containers"][0]["args"]


def pod_labels(objs: list[dict], name: str) -> dict[str, str]:
    (dep,) = find(objs, "Deployment", name)
    return dep["spec"]["template"]["metadata"]["labels"]


def selects(peer: dict, namespace_labels: dict[str, str], labels: dict[str, str]) -> bool:
    """Whether a NetworkPolicyPeer with matchLabels selectors admits a pod with `labels` in a namespace
    with `namespace_labels` (no selector: the policy's own namespace, which these peers never rely on)."""
    ns = (peer.get("namespaceSelector") or {}).get("matchLabels")
    pods = (peer.get("podSelector") or {}).get("matchLabels") or {}
    return ns is not None and ns.items() <= namespace_labels.items() and pods.items() <= labels.items()


def policy_settings(objs: list[dict]) -> NetworkPolicySettings:
    (flag,) = [a for a in args_of(objs, "skiff-operator") if a.startswith("--network-policy=")]
    return NetworkPolicySettings.parse(flag.split("=", 1)[1])


def test_model_pods_admit_the_router_the_scraper_the_operator_and_each_other():
    objs = objects({})
    assert "--internal-api-keys" in args_of(objs, "skiff-operator")
    settings = policy_settings(objs)
    system = {"kubernetes.io/metadata.name": RELEASE_NS}
    router, operator = pod_labels(objs, "skiff-router"), pod_labels(objs, "skiff-operator")
    assert [selects(p, system, router) for p in settings.api_from] == [True]
    assert not any(selects(p, system, operator) for p in settings.api_from)  # API: the router alone
    assert any(selects(p, system, operator) for p in settings.metrics_from)  # the autoscaler scrapes
    prometheus = ({"kubernetes.io/metadata.name": "monitoring"}, {"app.kubernetes.io/name": "prometheus"})
    assert any(selects(p, *prometheus) for p in settings.metrics_from)
    assert not any(selects(p, *prometheus) for p in settings.api_from)

    isvc = {"metadata": {"name": "chat", "namespace": "team-a", "uid": "u1"}, "spec": {}}
    fronted = OperatorSettings(internal_api_keys=True, network_policy=settings)
    children = desired_children(isvc, fronted)
    (policy,) = [c for c in children if c["kind"] == "NetworkPolicy"]
    assert policy == network_policy(isvc, settings)
    for version in claimed_versions():
        kubernetes_validate.validate(policy, version, strict=True)
    pods = next(c for c in children if c["kind"] == "Deployment")["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pods["metadata"]["labels"].items()
    ports = {p["name"] for p in pods["spec"]["containers"][0]["ports"]}
    assert {p["port"] for rule in policy["spec"]["ingress"] for p in rule.get("ports", [])} <= ports


def test_router_policy_opens_the_api_and_keeps_metrics_for_the_scraper():
    objs = objects({"networkPolicy": {"routerFrom": [{"namespaceSelector": {"matchLabels": {"a": "b"}}}]}})
    (policy,) = find(objs, "NetworkPolicy", "skiff-router")
    router = pod_labels(objs, "skiff-router")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= router.items()
    api, metrics = policy["spec"]["ingress"]
    assert api == {
        "ports": [{"protocol": "TCP", "port": "http"}],
        "from": [{"namespaceSelector": {"matchLabels": {"a": "b"}}}],
    }
    assert metrics["ports"] == [{"protocol": "TCP", "port": "metrics"}]
    system = {"kubernetes.io/metadata.name": RELEASE_NS}
    assert any(selects(p, system, pod_labels(objs, "skiff-operator")) for p in metrics["from"])
    (default,) = find(objects({}), "NetworkPolicy", "skiff-router")
    assert "from" not in default["spec"]["ingress"][0]  # no routerFrom: the API is open to anyone
    (dep,) = find(objs, "Deployment", "skiff-router")
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert "--metrics-port=9090" in container["args"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 8080, "metrics": 9090}
    (svc,) = find(objs, "Service", "skiff-router")
    assert {p["name"] for p in svc["spec"]["ports"]} == {"http", "metrics"}


@pytest.mark.parametrize(
    ("values", "keys", "policies"),
    [
        ({"router": {"enabled": False}}, False, False),  # no router: no key nobody holds, no policy
        ({"networkPolicy": {"enabled": False}}, True, False),  # keys hold on any CNI, without policies
    ],
)
def test_what_turns_keys_and_policies_off(values, keys, policies):
    objs = objects(values)
    args = args_of(objs, "skiff-operator")
    assert ("--internal-api-keys" in args) == keys
    assert any(a.startswith("--network-policy=") for a in args) == policies
    assert bool(find(objs, "NetworkPolicy")) == policies


def test_service_monitors_scrape_the_metrics_ports():
    objs = objects({"serviceMonitor": {"enabled": True}})
    for sm in find(objs, "ServiceMonitor"):
        assert [e["port"] for e in sm["spec"]["endpoints"]] == ["metrics"], sm["metadata"]["name"]
    isvc = {"metadata": {"name": "chat", "namespace": "team-a", "uid": "u1"}, "spec": {}}
    services = [c for c in desired_children(isvc) if c["kind"] == "Service"]
    with_metrics = [
        s["metadata"]["name"] for s in services if any(p["name"] == "metrics" for p in s["spec"]["ports"])
    ]
    assert with_metrics == ["chat-pods"]  # one Service per pod set: each pod scraped once
