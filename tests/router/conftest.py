from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def kube():
    from kube_fixture import kube_api

    with kube_api() as client:
        yield client
