"""A real kube-apiserver with Skiff's CRDs, for the router's Kubernetes discovery tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.kube import Api, kube_api


@pytest.fixture(scope="module")
def kube() -> Iterator[Api]:
    with kube_api() as api:
        yield api
