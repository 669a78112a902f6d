"""The code base is ruff-clean and ruff-formatted (pyproject.toml's [tool.ruff]): lint rules and line length."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_ruff_lint_is_clean() -> None:
    out = _ruff("check", "--output-format", "concise", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format_leaves_every_file_unchanged() -> None:
    out = _ruff("format", "--check", ".")
    assert out.returncode == 0, out.stdout + out.stderr
