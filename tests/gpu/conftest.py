"""The models of the GPU tests, each built once per session (HF's random weights saved, then Skiff's default
run over them) and shared by every test module that names it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from gpu_setup import MISSING, Reference, build_reference, torch_dtype


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str, str], Reference]]:
    if MISSING is not None:
        pytest.skip(MISSING)
    built: dict[tuple[str, str], Reference] = {}

    def get(shape: str, dtype: str) -> Reference:
        if (shape, dtype) not in built:
            built[(shape, dtype)] = build_reference(shape, torch_dtype(dtype), tmp_path_factory.mktemp(shape))
        return built[(shape, dtype)]

    yield get
    built.clear()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
