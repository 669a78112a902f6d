"""A real kube-apiserver for the autoscaler tests, shared by the modules here (see tests/router/kube_fixture.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from kube_fixture import kube_api, wait_for  # noqa: E402

__all__ = ["wait_for"]


@pytest.fixture(scope="session")
def kube() -> Iterator:
    with kube_api() as client:
        yield client
