"""The operator's installed identity on the test API server: its ServiceAccount and RBAC objects taken from
manifests/install.yaml or from the chart rendered by real Helm, applied as a user applies them, and a
kubeconfig with a token of that ServiceAccount (TokenRequest API), so a test operator gets exactly the
installed permissions and no more."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes
import yaml

from support.kube import Api
from support.kube_apiserver import kubeconfig_yaml
from support.paths import ROOT

RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
AUDIENCE = "https://kubernetes.default.svc.cluster.local"


def renderer() -> ModuleType:
    """scripts/render_manifests.py as a module (the chart rendered by real Helm)."""
    spec = importlib.util.spec_from_file_location(
        "render_manifests", ROOT / "scripts" / "render_manifests.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def operator_objects(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator's ServiceAccount and (Cluster)Role(Binding)s among rendered objects."""
    return [
        o
        for o in objs
        if o["kind"] in RBAC_KINDS
        and (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "operator"
    ]


def install_yaml_objects() -> list[dict[str, Any]]:
    text = (ROOT / "manifests" / "install.yaml").read_text()
    return operator_objects([d for d in yaml.safe_load_all(text) if d])


def chart_objects(values: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
    rendered = renderer().render(values, namespace=namespace)
    return operator_objects([o for objs in rendered.values() for o in objs])


def _ensure_namespace(api: Api, name: str) -> None:
    try:
        api.core.create_namespace({"metadata": {"name": name}})
    except kubernetes.client.ApiException as e:
        if e.status != 409:
            raise


def apply_objects(api: Api, objs: list[dict[str, Any]]) -> None:
    """Creates the objects (or replaces them when they exist), their namespaces first."""
    for o in objs:
        if o["metadata"].get("namespace"):
            _ensure_namespace(api, o["metadata"]["namespace"])
    for o in objs:
        if _exists(api, o):
            _replace(api, o)
        else:
            kubernetes.utils.create_from_dict(api.client, o)


def _rbac(api: Api) -> kubernetes.client.RbacAuthorizationV1Api:
    return kubernetes.client.RbacAuthorizationV1Api(api.client)


def _exists(api: Api, o: dict[str, Any]) -> bool:
    name, ns = o["metadata"]["name"], o["metadata"].get("namespace")
    read = {
        "ServiceAccount": lambda: api.core.read_namespaced_service_account(name, ns),
        "ClusterRole": lambda: _rbac(api).read_cluster_role(name),
        "ClusterRoleBinding": lambda: _rbac(api).read_cluster_role_binding(name),
        "Role": lambda: _rbac(api).read_namespaced_role(name, ns),
        "RoleBinding": lambda: _rbac(api).read_namespaced_role_binding(name, ns),
    }[o["kind"]]
    try:
        read()
    except kubernetes.client.ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


def _replace(api: Api, o: dict[str, Any]) -> None:
    name, ns = o["metadata"]["name"], o["metadata"].get("namespace")
    replace = {
        "ServiceAccount": lambda: None,  # nothing in it to change
        "ClusterRole": lambda: _rbac(api).replace_cluster_role(name, o),
        "ClusterRoleBinding": lambda: _rbac(api).replace_cluster_role_binding(name, o),
        "Role": lambda: _rbac(api).replace_namespaced_role(name, ns, o),
        "RoleBinding": lambda: _rbac(api).replace_namespaced_role_binding(name, ns, o),
    }[o["kind"]]
    replace()


def service_account(objs: list[dict[str, Any]]) -> tuple[str, str]:
    (sa,) = [o for o in objs if o["kind"] == "ServiceAccount"]
    return sa["metadata"]["namespace"], sa["metadata"]["name"]


def service_account_kubeconfig(api: Api, namespace: str, name: str, path: Path) -> Path:
    """A kubeconfig of the test server with a one-hour token of ServiceAccount namespace/name."""
    request = kubernetes.client.AuthenticationV1TokenRequest(
        spec=kubernetes.client.V1TokenRequestSpec(audiences=[AUDIENCE], expiration_seconds=3600)
    )
    token = api.core.create_namespaced_service_account_token(name, namespace, request).status.token
    path.write_text(kubeconfig_yaml(api.client.configuration.host, token))
    return path


def installed_operator_kubeconfig(api: Api, objs: list[dict[str, Any]], path: Path) -> Path:
    """Applies the operator's installed RBAC objects and returns a kubeconfig of its ServiceAccount."""
    apply_objects(api, objs)
    return service_account_kubeconfig(api, *service_account(objs), path)


def can(
    api: Api,
    sa: tuple[str, str],
    verb: str,
    group: str,
    resource: str,
    subresource: str | None = None,
    namespace: str | None = None,
) -> bool:
    """The API server's RBAC decision (a SubjectAccessReview) for ServiceAccount `sa` = (namespace, name).
    A subresource is its own attribute: "deployments/scale" as a resource would name a Deployment."""
    sa_ns, sa_name = sa
    review = kubernetes.client.V1SubjectAccessReview(
        spec=kubernetes.client.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{sa_ns}:{sa_name}",
            groups=["system:serviceaccounts", f"system:serviceaccounts:{sa_ns}", "system:authenticated"],
            resource_attributes=kubernetes.client.V1ResourceAttributes(
                verb=verb, group=group, resource=resource, subresource=subresource, namespace=namespace
            ),
        )
    )
    api_ = kubernetes.client.AuthorizationV1Api(api.client)
    return bool(api_.create_subject_access_review(review).status.allowed)
