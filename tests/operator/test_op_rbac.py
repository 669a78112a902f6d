"""The installed RBAC on a real API server: a SubjectAccessReview for every verb of every permission the
operator declares (skiff_operator.rbac), for its ServiceAccount as manifests/install.yaml and as the
namespaced chart install it, and denials for what it must not do."""

from __future__ import annotations

import pytest
from skiff_operator.rbac import OPERATOR_PERMISSIONS, Permission
from support.kube import Api
from support.operator_rbac import apply_objects, can, chart_objects, install_yaml_objects, service_account

DENIED = [  # (verb, group, resource, subresource); Secrets are read by name only (internal keys)
    ("list", "", "secrets", None),
    ("watch", "", "secrets", None),
    ("delete", "apps", "deployments", None),
    ("create", "", "pods", None),
    ("update", "apps", "deployments", "scale"),
    ("delete", "skiff.dev", "inferenceservices", None),
]


def allowed(api: Api, sa: tuple[str, str], p: Permission, verb: str, namespace: str | None) -> bool:
    ns = namespace if p.scope == "namespaced" else None
    return can(api, sa, verb, p.group, p.base_resource, p.subresource, ns)


def test_install_yaml_grants_every_declared_permission(api: Api, namespace: str) -> None:
    objs = install_yaml_objects()
    apply_objects(api, objs)
    sa = service_account(objs)
    missing = [
        (p.group, p.resource, verb)
        for p in OPERATOR_PERMISSIONS
        for verb in p.verbs
        if not allowed(api, sa, p, verb, namespace)
    ]
    assert missing == []
    assert [d for d in DENIED if can(api, sa, d[0], d[1], d[2], d[3], namespace)] == []


@pytest.mark.parametrize("watched", [True, False], ids=["watched", "other-namespace"])
def test_namespaced_chart_grants_only_in_watched_namespaces(api: Api, namespace: str, watched: bool) -> None:
    release_ns = f"{namespace}-op"
    values = {"rbac": {"clusterWide": False}, "operator": {"watchNamespaces": [namespace]}}
    objs = chart_objects(values, release_ns)
    apply_objects(api, objs)
    sa = service_account(objs)
    assert sa == (release_ns, "skiff-operator")
    target = namespace if watched else "default"
    for p in OPERATOR_PERMISSIONS:
        for verb in p.verbs:
            # cluster-scoped reads always; namespaced rows in watched namespaces; clusterwide rows never
            want = p.scope == "cluster" or (watched and p.scope == "namespaced")
            assert allowed(api, sa, p, verb, target) == want, (p.group, p.resource, verb)
    assert [d for d in DENIED if can(api, sa, d[0], d[1], d[2], d[3], target)] == []
    api.core.delete_namespace(release_ns)


def test_scale_is_a_subresource_question(api: Api, namespace: str) -> None:
    """`can-i patch deployments/scale` names a Deployment called "scale"; the subresource is its own field."""
    objs = install_yaml_objects()
    apply_objects(api, objs)
    sa = service_account(objs)
    assert can(api, sa, "patch", "apps", "deployments", "scale", namespace)
    assert not can(api, sa, "patch", "apps", "deployments", "status", namespace)
