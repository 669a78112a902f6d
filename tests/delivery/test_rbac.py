"""The operator's RBAC as shipped is its declaration (skiff_operator.rbac), in every variant: the chart's
ClusterRole (cluster-wide), its Roles and cluster-reads ClusterRole (namespaced), and manifests/install.yaml."""

from __future__ import annotations

import yaml
from delivery_helpers import ROOT, find, renderer
from skiff_operator import rbac


def objects(values: dict) -> list[dict]:
    return [o for objs in renderer.render(values).values() for o in objs]


def all_scopes() -> list[dict]:
    return rbac.rules("namespaced") + rbac.rules("cluster") + rbac.rules("clusterwide")


def test_cluster_wide_chart_role_is_the_declaration():
    (role,) = find(objects({}), "ClusterRole", "skiff-operator")
    assert role["rules"] == all_scopes()


def test_namespaced_chart_roles_are_the_declaration():
    objs = objects({"rbac": {"clusterWide": False}, "operator": {"watchNamespaces": ["team-a", "team-b"]}})
    roles = find(objs, "Role", "skiff-operator")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert all(r["rules"] == rbac.rules("namespaced") for r in roles)
    (reads,) = find(objs, "ClusterRole", "skiff-operator-cluster-reads")
    assert reads["rules"] == rbac.rules("cluster")
    assert not find(objs, "ClusterRole", "skiff-operator")


def test_install_yaml_role_is_the_declaration():
    docs = [d for d in yaml.safe_load_all((ROOT / "manifests" / "install.yaml").read_text()) if d]
    (role,) = find(docs, "ClusterRole", "skiff-operator")
    assert role["rules"] == all_scopes()


def test_least_privilege():
    granted = {(p.group, p.resource) for p in rbac.OPERATOR_PERMISSIONS}
    secrets = next(p for p in rbac.OPERATOR_PERMISSIONS if p.resource == "secrets")
    assert {"list", "watch"}.isdisjoint(secrets.verbs)  # internal keys by name: Secrets are never listed
    assert ("apps", "deployments/scale") in granted  # the autoscaler's path to the Deployment
    deployments = next(p for p in rbac.OPERATOR_PERMISSIONS if p.resource == "deployments")
    assert "delete" not in deployments.verbs  # the Deployment is never pruned
    assert not any("*" in p.verbs or "*" in p.resource for p in rbac.OPERATOR_PERMISSIONS)
    assert len(granted) == len(rbac.OPERATOR_PERMISSIONS), "one row per resource"


def test_generated_template_is_committed():
    committed = (ROOT / "charts" / "skiff" / "templates" / "_rbac_operator.tpl").read_text()
    assert committed == rbac.chart_template()
