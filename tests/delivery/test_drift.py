"""manifests/install.yaml and the chart's CRD copy are exactly what a fresh render produces."""

from __future__ import annotations

import shutil
import subprocess
import sys

import yaml
from delivery_helpers import CHART, ROOT, renderer

SCRIPT = ROOT / "scripts" / "render_manifests.py"


def run_check(root) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(root / "scripts" / "render_manifests.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_manifests_match_a_fresh_render():
    proc = run_check(ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr


def test_chart_crd_is_the_operator_generated_one(crds):
    for crd in crds:
        copy = CHART / "files" / "crds" / f"{crd['metadata']['name']}.yaml"
        assert yaml.safe_load(copy.read_text()) == crd


def test_install_yaml_is_the_default_render():
    docs = [d for d in yaml.safe_load_all((ROOT / "manifests" / "install.yaml").read_text()) if d]
    assert docs == renderer.install_objects()
    kinds = [d["kind"] for d in docs]
    assert kinds[0] == "Namespace" and kinds.index("CustomResourceDefinition") < kinds.index("Deployment")
    assert not any("helm.sh/hook" in (d["metadata"].get("annotations") or {}) for d in docs)


def test_check_fails_when_the_chart_changes(tmp_path):
    """A chart edit without re-rendering is caught, with a diff naming the change."""
    for part in ("charts", "manifests", "scripts", "operator"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    values = tmp_path / "charts" / "skiff" / "values.yaml"
    values.write_text(values.read_text().replace("  port: 8080\n", "  port: 9191\n", 1))
    proc = run_check(tmp_path)
    assert proc.returncode == 1
    added = [line for line in proc.stdout.splitlines() if line.startswith("+") and "9191" in line]
    assert any("--port=9191" in a for a in added) and any("containerPort: 9191" in a for a in added), (
        proc.stdout
    )
    assert "out of date" in proc.stderr
    subprocess.run(
        [sys.executable, str(tmp_path / "scripts" / "render_manifests.py")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert run_check(tmp_path).returncode == 0
