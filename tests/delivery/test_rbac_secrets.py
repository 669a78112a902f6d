"""Least privilege for Secrets, decided by a real kube-apiserver's RBAC authorizer: the chart's RBAC objects
(cluster-wide and namespaced values) are created on the test control plane, then SubjectAccessReviews ask
what the router's and the operator's ServiceAccounts may do with Secrets. Neither may list (or watch)
Secrets cluster-wide, nor in a namespace where it only needs Secrets it knows by name."""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes
import pytest
from delivery_helpers import renderer
from support.kube import NO_KUBE, Api, connect, control_plane
from support.kube_apiserver import binaries_present

pytestmark = [pytest.mark.skipif(not binaries_present(), reason=NO_KUBE), pytest.mark.timeout(180)]

SYSTEM = "skiff-system"
RBAC_KINDS = {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"}
ROUTER = f"system:serviceaccount:{SYSTEM}:skiff-router"
OPERATOR = f"system:serviceaccount:{SYSTEM}:skiff-operator"


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    with control_plane() as cp:
        yield connect(cp.kubeconfig)


def install_rbac(api: Api, values: dict, release: str) -> None:
    """The chart's RBAC objects (and ServiceAccounts) as rendered with `values`, namespaces created."""
    objs = [
        o for v in renderer.render(values, release=release).values() for o in v if o["kind"] in RBAC_KINDS
    ]
    assert objs, "the chart renders RBAC"
    for ns in sorted({o["metadata"]["namespace"] for o in objs if o["metadata"].get("namespace")}):
        try:
            api.core.create_namespace({"metadata": {"name": ns}})
        except kubernetes.client.ApiException as e:
            if e.status != 409:
                raise
    for obj in objs:
        kubernetes.utils.create_from_dict(api.client, obj)


def can(api: Api, user: str, verb: str, namespace: str | None, resource: str = "secrets") -> bool:
    review = kubernetes.client.V1SubjectAccessReview(
        spec=kubernetes.client.V1SubjectAccessReviewSpec(
            user=user,
            groups=["system:serviceaccounts", f"system:serviceaccounts:{SYSTEM}", "system:authenticated"],
            resource_attributes=kubernetes.client.V1ResourceAttributes(
                verb=verb, group="", resource=resource, namespace=namespace
            ),
        )
    )
    api_ = kubernetes.client.AuthorizationV1Api(api.client)
    return bool(api_.create_subject_access_review(review).status.allowed)


def test_cluster_wide_rbac_lists_no_secrets_cluster_wide(api: Api) -> None:
    install_rbac(api, {}, "skiff")
    for user in (ROUTER, OPERATOR):
        for verb in ("list", "watch"):
            assert not can(api, user, verb, None), (user, verb, "cluster-wide")
            assert not can(api, user, verb, "models"), (user, verb, "a model namespace")
    # by name where the services live: the router reads keys, the operator keeps the internal ones
    assert can(api, ROUTER, "get", "models")
    for verb in ("create", "patch", "update", "delete"):
        assert not can(api, ROUTER, verb, "models"), verb
    for verb in ("get", "create", "patch", "delete"):
        assert can(api, OPERATOR, verb, "models"), verb
    # client keys: listed by label in the router's own namespace only
    assert can(api, ROUTER, "list", SYSTEM) and not can(api, ROUTER, "watch", SYSTEM)
    assert not can(api, OPERATOR, "list", SYSTEM)


def test_namespaced_rbac_reads_secrets_only_in_watched_namespaces(api: Api) -> None:
    """Release `lp` (ServiceAccounts lp-skiff-*), so the cluster-wide release above grants it nothing."""
    values = {"rbac": {"clusterWide": False}, "operator": {"watchNamespaces": ["team-a", "team-b"]}}
    install_rbac(api, values, "lp")
    router, operator = (f"system:serviceaccount:{SYSTEM}:lp-skiff-{c}" for c in ("router", "operator"))
    for user in (router, operator):
        assert not can(api, user, "list", None), (user, "cluster-wide")
        assert not can(api, user, "get", "elsewhere"), (user, "an unwatched namespace")
    for ns in ("team-a", "team-b"):
        assert can(api, router, "list", ns) and can(api, router, "get", ns)
        assert can(api, operator, "create", ns) and not can(api, operator, "list", ns)
