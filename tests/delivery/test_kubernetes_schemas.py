"""Every object the chart renders (each values file, hooks and crds/ included) and manifests/install.yaml
validate against the Kubernetes API schemas of every version Chart.yaml claims (kubernetes-validate,
strict: unknown fields fail). Custom resources validate against their CRDs."""

from __future__ import annotations

import functools
import json

import kubernetes_validate
import kubernetes_validate.utils as kvu
import pytest
import yaml
from crdcheck import validate as validate_cr
from delivery_helpers import ROOT, claimed_versions, renderer

# kubernetes-validate re-reads the schema files on every call; the files do not change during a run.
kvu.schema_contents = functools.lru_cache(maxsize=None)(kvu.schema_contents)

# Kinds whose CRDs live outside this project (the Prometheus Operator's); nothing else may lack a schema.
FOREIGN_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}


def unique_objects(rendered) -> list[dict]:
    seen, out = set(), []
    install = [d for d in yaml.safe_load_all((ROOT / "manifests" / "install.yaml").read_text()) if d]
    for obj in [o for objs in rendered.values() for o in objs] + install:
        key = json.dumps(obj, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(obj)
    return out


@pytest.mark.parametrize("version", claimed_versions())
def test_rendered_objects_validate(rendered, crds, version):
    by_kind = {
        (f"{c['spec']['group']}/{v['name']}", c["spec"]["names"]["kind"]): c
        for c in crds + renderer.chart_crd_folder()
        for v in c["spec"]["versions"]
    }
    problems, custom = [], 0
    for obj in unique_objects(rendered):
        key = (obj["apiVersion"], obj["kind"])
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if key in by_kind:
            custom += 1
            problems += [f"{name}: {p}" for p in validate_cr(by_kind[key], obj)]
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            if key not in FOREIGN_KINDS:
                problems.append(f"{name}: no schema for {key} in Kubernetes {version}")
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{name}: {'.'.join(map(str, e.path))}: {e.message}")
    assert custom, "the catalog and peering objects should have been checked against their CRDs"
    assert problems == [], "\n".join(problems)


def test_validation_catches_a_broken_object():
    """The check above can fail: a Deployment with a typo'd field and a bad port is rejected."""
    objs = [o for v in renderer.render({}).values() for o in v]
    dep = next(o for o in objs if o["kind"] == "Deployment")
    dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, claimed_versions()[0], strict=True)
    dep = next(o for o in objs if o["kind"] == "Deployment")
    dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = 8080
    dep["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, claimed_versions()[-1], strict=True)
