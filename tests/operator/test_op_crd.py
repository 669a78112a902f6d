"""The generated CRD: committed YAML matches the generator; schema shape Kubernetes requires."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
import yaml
from skiff_operator import crdgen
from skiff_operator.crd import crd_manifest
from support.paths import ROOT


def test_committed_files_match_the_generator() -> None:
    for rel, content in crdgen.generated_files().items():
        path = ROOT / rel
        assert path.exists(), f"{rel} missing: run python -m skiff_operator.crdgen"
        assert path.read_text() == content, f"{rel} drifted from spec.py: run python -m skiff_operator.crdgen"
    assert crdgen.main(["--root", str(ROOT), "--check"]) == 0


def test_check_mode_detects_drift(tmp_path) -> None:
    assert crdgen.main(["--root", str(tmp_path)]) == 0
    target = tmp_path / "manifests/crds/inferenceservices.skiff.dev.yaml"
    target.write_text(target.read_text().replace("tensorParallel", "tp"))
    assert crdgen.main(["--root", str(tmp_path), "--check"]) == 1


def _walk(node, path="$"):
    yield path, node
    for name, sub in (node.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural() -> None:
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    text = json.dumps(schema)
    for forbidden in ('"$ref"', '"anyOf"', '"allOf"', '"oneOf"', '"title"', '"null"'):
        assert forbidden not in text
    for path, node in _walk(schema):
        assert "type" in node or node.get("x-kubernetes-int-or-string"), path
        assert not ("properties" in node and "additionalProperties" in node), path
        if node.get("type") == "array" and any("x-kubernetes-validations" in n for _, n in _walk(node)):
            assert "maxItems" in node, f"{path}: CEL over an unbounded list exceeds the cost budget"


def test_crd_contract_fields() -> None:
    crd = crd_manifest()
    version = crd["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    auto = spec["autoscaling"]["properties"]
    assert auto["mode"]["enum"] == ["operator", "hpa", "keda"] and auto["mode"]["default"] == "operator"
    assert auto["minReplicas"]["minimum"] == 0
    assert auto["metric"]["enum"] == ["queue", "running", "kvUsage", "concurrency"]
    for key in (
        "maxReplicas",
        "targetPerReplica",
        "scaleUpStabilizationSeconds",
        "scaleDownStabilizationSeconds",
        "maxScaleUpStep",
        "maxScaleDownStep",
        "idleToZeroSeconds",
        "prometheusAddress",
    ):
        assert key in auto
    assert spec["routing"]["properties"]["strategy"]["default"] == "prefixHash"
    assert spec["routing"]["properties"]["prefixChars"]["type"] == "integer"
    assert "apiKeySecretRef" in spec
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "isvc" not in crd["spec"]["names"]["shortNames"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["conditions"]["x-kubernetes-list-type"] == "map"
    assert {
        "observedGeneration",
        "replicas",
        "readyReplicas",
        "updatedReplicas",
        "selector",
        "url",
        "servedModel",
        "phase",
    } <= set(status)
    columns = {c["name"] for c in version["additionalPrinterColumns"]}
    assert {"Model", "TP", "Ready", "Replicas", "URL", "Age"} <= columns


@pytest.mark.parametrize("version", ["1.29.0", "1.33.0", "1.37.0"])
def test_crd_validates_against_kubernetes(version: str) -> None:
    for path in (ROOT / "manifests/crds").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            kubernetes_validate.validate(doc, version, strict=True)
