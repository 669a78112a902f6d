"""The Helm chart through real Helm (helm-python-sdk, Helm v4 in-process): lint, render per values file,
values.schema.json on good and bad values."""

from __future__ import annotations

import helm_python as helm
import pytest
import yaml
from delivery_helpers import CHART, VALUES_FILES, claimed_versions, find, renderer, values_of


def lint_problems(values, kube_version):
    report = helm.lint(str(CHART), values, strict=True, kube_version=kube_version)
    return [m for m in report["messages"] if m["severity"] >= 2] + [{"error": e} for e in report["errors"]]


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=lambda p: p.stem)
def test_lint_strict_clean_for_claimed_versions(values_file):
    for version in (claimed_versions()[0], claimed_versions()[-1]):
        assert lint_problems(values_of(values_file), f"v{version}.0") == [], (values_file.name, version)


def test_chart_metadata():
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2" and meta["type"] == "application"
    assert meta["version"] and meta["appVersion"] and meta["kubeVersion"].startswith(">=")
    pyproject = (CHART.parents[1] / "pyproject.toml").read_text()
    assert f'version = "{meta["appVersion"]}"' in pyproject, "appVersion must be the Skiff release"


def test_defaults_render_operator_router_rbac(rendered):
    objs = rendered["default-values"]
    (op,) = find(objs, "Deployment", "skiff-operator")
    pod = op["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert (
        c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        and not c["securityContext"]["allowPrivilegeEscalation"]
    )
    assert c["livenessProbe"]["httpGet"]["port"] == "health" and c["readinessProbe"]
    assert "--peering=skiff-operator" in c["args"] and not any(a.startswith("--namespace") for a in c["args"])
    assert "--default-image=skiff-project/skiff:0.1.0" in c["args"]
    assert op["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}  # peering-safe
    assert c["command"][:2] == ["/bin/sh", "-c"] and "--priority=" in c["command"][2]
    assert c["image"] == "skiff-project/skiff-operator:0.1.0"  # appVersion, never latest
    (role,) = find(objs, "ClusterRole", "skiff-operator")
    granted = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    for need in [
        ("skiff.dev", "inferenceservices"),
        ("skiff.dev", "inferenceservices/status"),
        ("skiff.dev", "inferenceservices/scale"),
        ("apps", "deployments"),
        ("", "services"),
        ("policy", "poddisruptionbudgets"),
        ("", "pods"),
        ("apps", "deployments/scale"),
        ("", "events"),
        ("autoscaling", "horizontalpodautoscalers"),
        ("keda.sh", "scaledobjects"),
        ("kopf.dev", "kopfpeerings"),
        ("kopf.dev", "clusterkopfpeerings"),
        ("", "persistentvolumeclaims"),
    ]:
        assert need in granted, need
    secrets = [r for r in role["rules"] if "secrets" in r["resources"]]
    assert secrets and all("list" not in r["verbs"] and "watch" not in r["verbs"] for r in secrets), (
        "Secrets by name only: never listed cluster-wide"
    )
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in role["rules"])
    (router,) = find(objs, "Deployment", "skiff-router")
    assert router["spec"]["template"]["spec"]["containers"][0]["command"] == ["skiff-router"]
    (svc,) = find(objs, "Service", "skiff-router")
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    (crd,) = find(objs, "CustomResourceDefinition", "inferenceservices.skiff.dev")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert not find(objs, "PodDisruptionBudget")  # one replica: a PDB would block node drains
    assert find(objs, "ClusterKopfPeering", "skiff-operator")  # kopf stays paused until it sees one


def test_aggregated_roles(rendered):
    objs = rendered["default-values"]
    for role in ("admin", "edit", "view"):
        (r,) = find(objs, "ClusterRole", f"skiff-inferenceservice-{role}")
        assert r["metadata"]["labels"][f"rbac.authorization.k8s.io/aggregate-to-{role}"] == "true"
        verbs = {v for rule in r["rules"] for v in rule["verbs"]}
        assert ("create" in verbs) == (role != "view")


def test_namespaced_rbac_has_no_cluster_grants(rendered):
    objs = rendered["namespaced-rbac-values"]
    assert not find(objs, "ClusterRole", "skiff-operator")
    # The one cluster-wide grant: read-only namespaces and CRDs, which kopf lists even when namespaced.
    (reads,) = find(objs, "ClusterRole", "skiff-operator-cluster-reads")
    assert {r for rule in reads["rules"] for r in rule["resources"]} == {
        "namespaces",
        "customresourcedefinitions",
    }
    assert {v for rule in reads["rules"] for v in rule["verbs"]} == {"get", "list", "watch"}
    assert [b["metadata"]["name"] for b in find(objs, "ClusterRoleBinding")] == [
        "skiff-operator-cluster-reads"
    ]
    roles = find(objs, "Role", "skiff-operator")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for b in find(objs, "RoleBinding", "skiff-operator"):
        assert b["subjects"] == [
            {"kind": "ServiceAccount", "name": "skiff-operator", "namespace": "skiff-system"}
        ]
    args = find(objs, "Deployment", "skiff-operator")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    router = find(objs, "Deployment", "skiff-router")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in router and "--namespace=team-b" in router
    assert sorted(r["metadata"]["namespace"] for r in find(objs, "Role", "skiff-router")) == [
        "team-a",
        "team-b",
    ]


def test_namespaced_router_watches_its_namespace():
    objs = [o for v in renderer.render({"rbac": {"clusterWide": False}}, namespace="ml").values() for o in v]
    args = find(objs, "Deployment", "skiff-router")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=ml" in args
    (role,) = find(objs, "Role", "skiff-router")
    assert role["metadata"]["namespace"] == "ml" and not find(objs, "ClusterRoleBinding", "skiff-router")
    verbs = {v for r in role["rules"] for v in r["verbs"]}
    assert verbs == {"get", "list", "watch", "patch"}  # patch: only inferenceservices/scale (scale from zero)


def test_router_off_renders_no_router(rendered):
    objs = rendered["router-off-values"]
    names = {o["metadata"]["name"] for o in objs}
    assert "skiff-router" not in names and not find(objs, "Pod")  # no helm test without a router
    assert not find(objs, "CustomResourceDefinition", "inferenceservices.skiff.dev")  # crds.install=false
    assert find(objs, "Deployment", "skiff-operator")


def test_gpu_profiles_merge_into_catalog(rendered):
    objs = rendered["gpu-profiles-values"]
    isvcs = {o["metadata"]["name"]: o for o in find(objs, "InferenceService")}
    assert sorted(isvcs) == ["llama-3.1-70b-instruct", "qwen3-8b", "smollm2-135m-cpu"]
    for o in isvcs.values():
        assert o["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    qwen = isvcs["qwen3-8b"]["spec"]
    assert qwen["scheduling"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert qwen["scheduling"]["runtimeClassName"] == "nvidia" and qwen["resources"]["memory"] == "96Gi"
    assert qwen["model"]["source"] == "hf://Qwen/Qwen3-8B"
    llama = isvcs["llama-3.1-70b-instruct"]["spec"]
    assert llama["runtime"]["tensorParallel"] == 8 and llama["resources"]["shmSize"] == "16Gi"
    assert isvcs["smollm2-135m-cpu"]["spec"]["resources"]["gpus"] == 0
    monitors = {o["metadata"]["name"]: o for o in find(objs, "ServiceMonitor")}
    assert monitors["skiff-models"]["spec"]["namespaceSelector"] == {"any": True}
    assert monitors["skiff-router"]["metadata"]["labels"]["release"] == "prometheus"


def test_ha_uses_kopf_peering_and_pdbs(rendered):
    objs = rendered["ha-values"]
    op = find(objs, "Deployment", "skiff-operator")[0]
    args = op["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--peering=skiff-operator" in args and c_is_wrapped(op) and op["spec"]["replicas"] == 3
    assert find(objs, "ClusterKopfPeering", "skiff-operator")
    assert {p["metadata"]["name"] for p in find(objs, "PodDisruptionBudget")} == {
        "skiff-operator",
        "skiff-router",
    }
    peering_crds = {c["metadata"]["name"] for c in renderer.chart_crd_folder()}
    assert peering_crds == {"kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"}


def c_is_wrapped(deployment) -> bool:
    return deployment["spec"]["template"]["spec"]["containers"][0]["command"][0] == "/bin/sh"


def test_namespaced_ha_peers_per_namespace():
    objs = [
        o
        for v in renderer.render(
            {"operator": {"replicas": 2, "watchNamespaces": ["ml"]}, "rbac": {"clusterWide": False}}
        ).values()
        for o in v
    ]
    (peering,) = find(objs, "KopfPeering")
    assert peering["metadata"]["namespace"] == "ml" and not find(objs, "ClusterKopfPeering")


def test_catalog_profile_must_exist():
    with pytest.raises(helm.HelmRenderError, match='no resourceProfiles entry named "h200"'):
        renderer.render({"catalog": {"qwen3-8b": {"enabled": True, "profile": "h200"}}})


def test_notes_tell_how_to_reach_the_endpoint():
    with helm.Chart.load(str(CHART)) as c:
        notes = c.render({}, name="skiff", namespace="ml")["skiff/templates/NOTES.txt"]
    assert "http://skiff-router.ml.svc:80/v1" in notes
    assert "kubectl -n ml port-forward svc/skiff-router 8080:80" in notes
    assert "curl -s http://127.0.0.1:8080/v1/models" in notes and "kubectl get inferenceservices" in notes


def test_helm_test_pod_calls_models():
    objs = [o for v in renderer.render({}).values() for o in v]
    (pod,) = find(objs, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert "http://skiff-router.skiff-system.svc:80/v1/models" in pod["spec"]["containers"][0]["args"][0]


def test_extra_objects_are_templated():
    objs = [
        o
        for v in renderer.render(
            {
                "extraObjects": [
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: '{{ .Release.Name }}-extra'\n"
                ]
            }
        ).values()
        for o in v
    ]
    assert find(objs, "ConfigMap", "skiff-extra")


GOOD_VALUES = [
    {},
    {"image": {"tag": "0.1.0-rc1"}, "operator": {"replicas": 2, "logLevel": "debug"}},
    {"resourceProfiles": {"h200": {"resources": {"cpu": "500m", "memory": "1.5Ti", "gpus": 8}}}},
    {"router": {"service": {"type": "LoadBalancer", "port": 443}, "pdb": {"maxUnavailable": "50%"}}},
]
BAD_VALUES = [
    ({"image": {"tag": "latest"}}, "/image/tag"),
    ({"operator": {"replicas": "two"}}, "/operator/replicas': got string, want integer"),
    (
        {"router": {"service": {"type": "Ingress"}}},
        "value must be one of 'ClusterIP', 'NodePort', 'LoadBalancer'",
    ),
    ({"routerr": {"enabled": False}}, "additional properties 'routerr' not allowed"),
    (
        {"resourceProfiles": {"big": {"resources": {"memory": "lots"}}}},
        "/resourceProfiles/big/resources/memory",
    ),
    ({"operator": {"watchNamespaces": ["Team_A"]}}, "'Team_A' does not match pattern"),
    ({"operator": {"logLevel": "verbose"}}, "/operator/logLevel"),
    ({"catalog": {"m": {"enabled": True}}}, "missing property 'spec'"),
    ({"runtime": {"image": {"repository": ""}}}, "/runtime/image/repository"),
]


@pytest.mark.parametrize("values", GOOD_VALUES)
def test_schema_accepts(values):
    with helm.Chart.load(str(CHART)) as c:
        c.validate_schema(values)


@pytest.mark.parametrize(("values", "message"), BAD_VALUES, ids=[m for _, m in BAD_VALUES])
def test_schema_rejects_with_clear_message(values, message):
    with helm.Chart.load(str(CHART)) as c:
        with pytest.raises(helm.HelmValuesError) as err:
            c.validate_schema(values)
        assert message in str(err.value)
        with pytest.raises(helm.HelmValuesError):  # an install/render refuses the same values
            c.render(values, name="skiff")


def test_values_files_pass_schema():
    with helm.Chart.load(str(CHART)) as c:
        for f in VALUES_FILES:
            c.validate_schema(values_of(f))
