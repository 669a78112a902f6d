"""The example InferenceServices in manifests/examples/ and the chart's catalog presets are accepted by the
CRD the chart installs (schema, unknown fields, CEL rules); broken ones are rejected with the CRD's message."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from crdcheck import validate
from delivery_helpers import ROOT, find, renderer

EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))


def example_objects(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_examples_cover_the_documented_cases():
    specs = [o["spec"] for p in EXAMPLES for o in example_objects(p) if o["kind"] == "InferenceService"]
    assert len(specs) >= 5, [p.name for p in EXAMPLES]
    tp = [s.get("runtime", {}).get("tensorParallel", 1) for s in specs]
    assert 8 in tp, "a tensor-parallel 8 example"
    assert any(not s.get("model", {}).get("source") for s in specs), "an embedded-model example"
    assert any((s.get("autoscaling") or {}).get("minReplicas") == 0 for s in specs), "a scale-to-zero example"
    assert any(s.get("apiKeySecretRef") for s in specs), "an API-key example"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_accepted_by_the_crd(path, isvc_crd):
    objs = example_objects(path)
    assert objs
    for obj in objs:
        if obj["kind"] == "InferenceService":
            assert validate(isvc_crd, obj) == [], f"{path.name}: {obj['metadata']['name']}"
        else:  # Secrets and the like beside the CR
            assert obj["apiVersion"] == "v1" and obj["kind"] in {
                "Secret",
                "ConfigMap",
                "PersistentVolumeClaim",
            }


def test_catalog_presets_are_accepted_by_the_crd(isvc_crd):
    defaults = yaml.safe_load((ROOT / "charts" / "skiff" / "values.yaml").read_text())
    everything = {name: {"enabled": True} for name in defaults["catalog"]}
    objs = [o for v in renderer.render({"catalog": everything}).values() for o in v]
    isvcs = find(objs, "InferenceService")
    assert len(isvcs) == len(everything)
    for obj in isvcs:
        assert validate(isvc_crd, obj) == [], obj["metadata"]["name"]


def _base(isvc_crd) -> dict:
    return {
        "apiVersion": f"{isvc_crd['spec']['group']}/{isvc_crd['spec']['versions'][0]['name']}",
        "kind": "InferenceService",
        "metadata": {"name": "m"},
        "spec": {},
    }


@pytest.mark.parametrize(
    ("spec", "expect"),
    [
        ({"replicas": -1}, "replicas"),
        ({"modle": {}}, "Additional properties are not allowed"),
        ({"model": {"source": "ftp://example/x"}}, "does not match"),
        ({"runtime": {"tensorParallel": 3}}, "tensorParallel"),
        (
            {"runtime": {"tensorParallel": 8}, "resources": {"gpus": 2}},
            "resources.gpus must be 0 (CPU) or at least",
        ),
        ({"autoscaling": {"minReplicas": 3, "maxReplicas": 2}}, "minReplicas must not exceed maxReplicas"),
        ({"runtime": {"extraArgs": ["--tp=2"]}}, "must not set flags the operator owns"),
    ],
)
def test_broken_specs_are_rejected_with_a_message(isvc_crd, spec, expect):
    obj = copy.deepcopy(_base(isvc_crd))
    obj["spec"] = spec
    problems = validate(isvc_crd, obj)
    assert problems and any(expect in str(p) for p in problems), problems
