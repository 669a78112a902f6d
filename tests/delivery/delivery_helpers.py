"""Shared helpers for the delivery checks: the chart rendered by real Helm (helm-python-sdk), the values
files under charts/skiff/ci/, the CRD from the operator's generator. (A module of its own: every test
directory has a `conftest`, so importing names from one is ambiguous.)"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import yaml
from support.paths import CHART, ROOT

VALUES_FILES = sorted((CHART / "ci").glob("*-values.yaml"))


def _load_renderer():
    spec = importlib.util.spec_from_file_location(
        "render_manifests", ROOT / "scripts" / "render_manifests.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


renderer = _load_renderer()


def values_of(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def claimed_versions() -> list[str]:
    """Every Kubernetes minor that kubernetes-validate knows and Chart.yaml's kubeVersion admits."""
    import kubernetes_validate.utils as kvu

    constraint = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    m = re.fullmatch(r">=\s*(\d+)\.(\d+)\.\d+(-0)?", constraint)
    assert m, f"kubeVersion {constraint!r}: expected a '>=X.Y.Z-0' lower bound"
    low = (int(m[1]), int(m[2]))
    minors = sorted({tuple(int(x) for x in kvu.major_minor(v).split(".")) for v in kvu.all_versions()})
    return [f"{a}.{b}" for a, b in minors if (a, b) >= low]


def find(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
