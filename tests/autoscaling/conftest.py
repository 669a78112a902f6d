"""A real kube-apiserver with Skiff's CRDs, shared by the autoscaler's modules here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.kube import Api, kube_api


@pytest.fixture(scope="session")
def kube() -> Iterator[Api]:
    with kube_api() as api:
        yield api
