"""Golden and property tests of the pure reconcile function (spec -> desired children)."""

from __future__ import annotations

import copy
import dataclasses
import os

import kubernetes_validate
import pytest
import yaml
from op_helpers import example_crs, isvc, with_identity
from skiff_operator.access import NetworkPolicySettings
from skiff_operator.metadata import LABEL_HASH, LABEL_ISVC
from skiff_operator.render import OperatorSettings, desired_children, serve_command
from skiff_operator.spec import parse_spec
from support.paths import ROOT

K8S_VERSIONS = ["1.29.0", "1.33.0", "1.37.0"]
GOLDEN = ROOT / "tests/operator/golden"

MATRIX: dict[str, dict] = {
    "defaults": {},
    "hf-emptydir": {"model": {"source": "hf://Qwen/Qwen3-0.6B@main"}},
    "hf-existing-pvc": {"model": {"source": "hf://Qwen/Qwen3-8B"}, "modelCache": {"pvc": "shared-models"}},
    "file": {"model": {"source": "file:///mnt/models/qwen3"}, "runtime": {"tensorParallel": 2}},
    "tp8-explicit-gpus": {
        "runtime": {"tensorParallel": 8},
        "resources": {"gpus": 8, "gpuResourceName": "amd.com/gpu"},
    },
    "percent-rollout": {
        "rollout": {"maxSurge": "25%", "maxUnavailable": "25%"},
        "disruption": {"minAvailable": "50%"},
    },
    "no-pdb": {"disruption": {"enabled": False}, "service": {"type": "LoadBalancer", "port": 8080}},
    "hpa": {"autoscaling": {"mode": "hpa", "minReplicas": 1, "maxReplicas": 3}},
    "all-runtime-flags": {
        "runtime": {
            "maxRunningRequests": 8,
            "chunkedPrefillSize": 512,
            "pageSize": 32,
            "memFraction": 0.5,
            "attentionBackend": "torch",
            "cudaGraphMaxBatch": 4,
            "extraArgs": ["--enable-metrics"],
            "env": [{"name": "A", "value": "b"}],
        },
        "model": {"contextLength": 2048, "servedName": "tiny"},
    },
}
# As the chart runs the operator with the router enabled: internal keys and a NetworkPolicy per service.
FRONTED = OperatorSettings(
    internal_api_keys=True,
    network_policy=NetworkPolicySettings(
        api_from=({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "skiff-system"}}},),
        metrics_from=({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},),
    ),
)
CASES = {**{f"example-{k}": with_identity(v)["spec"] for k, v in example_crs().items()}, **MATRIX}


def render(spec: dict, settings: OperatorSettings | None = None) -> list[dict]:
    return desired_children(isvc(spec), settings)


def by_kind(children: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for c in children:
        out.setdefault(c["kind"], []).append(c)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_child_is_valid_kubernetes(case: str) -> None:
    for child in render(CASES[case]) + render(CASES[case], FRONTED):
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(child, version, strict=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_children_properties(case: str) -> None:
    spec = CASES[case]
    children = render(spec)
    kinds = by_kind(children)
    assert len(kinds["Deployment"]) == 1 and len(kinds["Service"]) == 2
    for child in children:
        if child["kind"] == "PersistentVolumeClaim":  # a model cache is kept by default (whenDeleted: Retain)
            assert "ownerReferences" not in child["metadata"]
            continue
        owner = child["metadata"]["ownerReferences"]
        assert owner == [
            {
                "apiVersion": "skiff.dev/v1alpha1",
                "kind": "InferenceService",
                "name": "demo",
                "uid": "0000-1111",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        labels = child["metadata"]["labels"]
        assert labels[LABEL_ISVC] == "demo" and labels["app.kubernetes.io/managed-by"] == "skiff-operator"
        assert child["metadata"]["namespace"] == "ml"
    dep = kinds["Deployment"][0]
    pod = dep["spec"]["template"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert pod["metadata"]["labels"][LABEL_HASH] == dep["metadata"]["annotations"][LABEL_HASH]
    server = pod["spec"]["containers"][0]
    assert server["readinessProbe"]["httpGet"]["path"] == "/health_generate"
    assert server["startupProbe"]["httpGet"]["path"] == "/health_generate"
    assert server["livenessProbe"]["httpGet"]["path"] == "/health"
    for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    shm = next(v for v in pod["spec"]["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    parsed = parse_spec(spec)
    gpus = parsed.runtime.tensor_parallel if parsed.resources.gpus is None else parsed.resources.gpus
    limits = server.get("resources", {}).get("limits", {})
    assert limits.get(parsed.resources.gpu_resource_name) == (str(gpus) if gpus else None)
    assert ("replicas" in dep["spec"]) == (parsed.autoscaling is None)
    assert server["command"][:2] == ["skiff", "serve"]
    cmd = server["command"]
    assert cmd[cmd.index("--tp") + 1] == str(parsed.runtime.tensor_parallel)
    assert ("PodDisruptionBudget" in kinds) == parsed.disruption.enabled


def test_model_sources_map_to_volumes_and_download_steps() -> None:
    hf = by_kind(render(MATRIX["hf-emptydir"]))["Deployment"][0]["spec"]["template"]["spec"]
    assert hf["initContainers"][0]["command"] == [
        "skiff",
        "download",
        "hf://Qwen/Qwen3-0.6B@main",
        "--dest",
        "/models/hf/Qwen/Qwen3-0.6B",
    ]
    assert {"name": "model", "emptyDir": {}} in hf["volumes"]
    server = hf["containers"][0]
    assert server["command"][server["command"].index("--model") + 1] == "/models/hf/Qwen/Qwen3-0.6B"
    assert next(m for m in server["volumeMounts"] if m["name"] == "model")["readOnly"] is True

    cached = render(
        {
            "model": {"source": "hf://Qwen/Qwen3-8B", "tokenSecretRef": {"name": "hf"}},
            "modelCache": {"size": "40Gi", "storageClass": "fast"},
        }
    )
    claim = by_kind(cached)["PersistentVolumeClaim"][0]
    assert claim["metadata"]["name"] == "demo-model-cache"
    assert "ownerReferences" not in claim["metadata"]  # Retain (the default): garbage collection keeps it
    deleted_with = render(
        {"model": {"source": "hf://a/b"}, "modelCache": {"size": "1Gi", "whenDeleted": "Delete"}}
    )
    owners = by_kind(deleted_with)["PersistentVolumeClaim"][0]["metadata"]["ownerReferences"]
    assert [o["kind"] for o in owners] == ["InferenceService"] and owners[0]["controller"]
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "40Gi"}},
        "storageClassName": "fast",
    }
    pod = by_kind(cached)["Deployment"][0]["spec"]["template"]["spec"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "demo-model-cache"}} in pod["volumes"]
    token = next(e for e in pod["initContainers"][0]["env"] if e["name"] == "HF_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}

    pvc = by_kind(render({"model": {"source": "pvc://models/llama/70b"}}))["Deployment"][0]["spec"][
        "template"
    ]
    vol = next(v for v in pvc["spec"]["volumes"] if v["name"] == "model")
    assert vol == {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    cmd = pvc["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--model") + 1] == "/models/pvc/llama/70b"

    node = by_kind(render(MATRIX["file"]))["Deployment"][0]["spec"]["template"]["spec"]
    assert {"name": "model", "hostPath": {"path": "/mnt/models/qwen3"}} in node["volumes"]
    assert node["initContainers"][0]["command"] == ["skiff", "download", "file:///mnt/models/qwen3"]

    embedded = by_kind(render({}))["Deployment"][0]["spec"]["template"]["spec"]
    assert "initContainers" not in embedded and "--model" not in embedded["containers"][0]["command"]


def test_serve_command_carries_every_runtime_option() -> None:
    spec = MATRIX["all-runtime-flags"]
    cmd = serve_command(isvc(spec), parse_spec(spec), None)
    assert cmd == [
        "skiff",
        "serve",
        "--served-model-name",
        "tiny",
        "--tp",
        "1",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--metrics-port",
        "9090",
        "--dtype",
        "auto",
        "--max-running-requests",
        "8",
        "--chunked-prefill-size",
        "512",
        "--page-size",
        "32",
        "--mem-fraction",
        "0.5",
        "--cuda-graph-max-bs",
        "4",
        "--context-length",
        "2048",
        "--attention-backend",
        "torch",
        "--enable-metrics",
    ]


def test_api_key_comes_from_the_users_secret_as_a_file() -> None:
    """A user's apiKeySecretRef is mounted (never an env var: a file is re-read when the Secret changes)."""
    spec = {"apiKeySecretRef": {"name": "keys", "key": "api-key"}}
    for settings in (OperatorSettings(), OperatorSettings(internal_api_keys=True)):
        pod = by_kind(render(spec, settings))["Deployment"][0]["spec"]["template"]["spec"]
        server = pod["containers"][0]
        assert not any(e["name"] == "SKIFF_API_KEY" for e in server["env"])
        cmd = server["command"]
        assert cmd[cmd.index("--api-key-file") + 1] == "/etc/skiff/api-key/keys" and "--api-key" not in cmd
        volume = next(v for v in pod["volumes"] if v["name"] == "api-key")
        assert volume["secret"]["secretName"] == "keys"
        assert volume["secret"]["items"] == [{"key": "api-key", "path": "keys"}]
        mount = next(m for m in server["volumeMounts"] if m["name"] == "api-key")
        assert mount == {"name": "api-key", "mountPath": "/etc/skiff/api-key", "readOnly": True}
    open_pod = by_kind(render({}))["Deployment"][0]["spec"]["template"]["spec"]
    assert "--api-key-file" not in open_pod["containers"][0]["command"]  # no router, no key: as before
    assert not any(v["name"] == "api-key" for v in open_pod["volumes"])


def test_template_hash_changes_only_with_the_pod_template() -> None:
    def digest(spec: dict) -> str:
        return by_kind(render(spec))["Deployment"][0]["metadata"]["annotations"][LABEL_HASH]

    base = {"runtime": {"dtype": "bfloat16"}, "replicas": 2}
    assert digest(base) == digest(copy.deepcopy(base))
    assert digest(base) == digest({**base, "replicas": 5})  # scaling is not a rollout
    assert digest(base) == digest({**base, "service": {"annotations": {"a": "b"}}})
    assert digest(base) != digest({**base, "runtime": {"dtype": "float16"}})
    assert digest(base) != digest({**base, "runtime": {"dtype": "bfloat16", "image": "skiff:0.2"}})


def test_operator_settings_and_pdb_fallback() -> None:
    settings = OperatorSettings(default_image="registry.example/skiff:9", pdb_api_version="policy/v1beta1")
    kinds = by_kind(render({}, settings))
    assert kinds["PodDisruptionBudget"][0]["apiVersion"] == "policy/v1beta1"
    assert (
        kinds["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["image"]
        == "registry.example/skiff:9"
    )


def test_traces_endpoint_reaches_the_server_env_unless_the_spec_sets_it() -> None:
    def env(spec: dict, settings: OperatorSettings) -> dict[str, str]:
        server = by_kind(render(spec, settings))["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in server["env"]}

    url = "http://otel-collector.observability:4318"
    assert "SKIFF_OTLP_TRACES_ENDPOINT" not in env({}, OperatorSettings())  # off by default
    assert env({}, OperatorSettings(traces_endpoint=url))["SKIFF_OTLP_TRACES_ENDPOINT"] == url
    own = {"runtime": {"env": [{"name": "SKIFF_OTLP_TRACES_ENDPOINT", "value": "http://mine:4318"}]}}
    names = [e for e in env(own, OperatorSettings(traces_endpoint=url)) if e == "SKIFF_OTLP_TRACES_ENDPOINT"]
    assert names == ["SKIFF_OTLP_TRACES_ENDPOINT"]
    assert env(own, OperatorSettings(traces_endpoint=url))["SKIFF_OTLP_TRACES_ENDPOINT"] == "http://mine:4318"


def test_autoscaler_objects_are_appended(monkeypatch) -> None:
    seen = []

    def autoscaler_objects(body: dict, hpa_api_version: str) -> list[dict]:
        seen.append((body["metadata"]["name"], hpa_api_version))
        return [
            {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": body["metadata"]["name"], "namespace": "ml"},
            }
        ]

    monkeypatch.setattr("skiff_operator.render.autoscaler_objects", autoscaler_objects)
    children = render({"autoscaling": {"mode": "hpa", "minReplicas": 1}})
    assert seen == [("demo", "autoscaling/v2")] and children[-1]["kind"] == "HorizontalPodAutoscaler"


def test_golden_qwen3_8b() -> None:
    """The full rendering of one example, reviewed by eye; UPDATE_GOLDEN=1 rewrites it."""
    cr = with_identity(example_crs()["qwen3-8b"])
    settings = dataclasses.replace(FRONTED, default_image="skiff:test")
    text = yaml.safe_dump_all(desired_children(cr, settings), sort_keys=True)
    path = GOLDEN / "qwen3-8b.yaml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.read_text() == text, "rendering changed: review and rerun with UPDATE_GOLDEN=1"
