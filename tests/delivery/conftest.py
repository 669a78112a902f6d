"""Fixtures for the delivery checks (helpers live in delivery_helpers.py)."""

from __future__ import annotations

from typing import Any

import pytest
from delivery_helpers import VALUES_FILES, renderer, values_of


@pytest.fixture(scope="session")
def crds() -> list[dict[str, Any]]:
    return renderer.operator_crds()


@pytest.fixture(scope="session")
def isvc_crd(crds) -> dict[str, Any]:
    return next(c for c in crds if c["spec"]["names"]["kind"] == "InferenceService")


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """values file stem -> every object the chart renders with it (hooks included, crds/ folder too)."""
    out = {}
    for f in VALUES_FILES:
        objs = [o for objs in renderer.render(values_of(f)).values() for o in objs]
        out[f.stem] = objs + renderer.chart_crd_folder()
    return out
