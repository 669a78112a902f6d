"""The real kubectl binary against the test control plane, as a user runs it."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def kubectl(kubeconfig: str, *args: str, timeout: float = 90) -> str:
    """`kubectl --kubeconfig KUBECONFIG ARGS...`'s stdout; an AssertionError with its stderr if it fails."""
    binary = shutil.which("kubectl")
    if binary is None:
        pytest.skip("no kubectl on PATH")
    proc = subprocess.run(
        [binary, "--kubeconfig", kubeconfig, *args], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}"
    return proc.stdout
