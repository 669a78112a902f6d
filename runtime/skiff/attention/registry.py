"""Attention backends by name (`--attention-backend`), and the choice that "auto" makes on a device."""

from __future__ import annotations

import torch

from skiff.attention.base import AttentionBackend
from skiff.attention.flashinfer_backend import FlashInferBackend
from skiff.attention.torch_backend import TorchBackend

BACKENDS: dict[str, type[AttentionBackend]] = {"torch": TorchBackend, "flashinfer": FlashInferBackend}


def get_backend(name: str) -> type[AttentionBackend]:
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {sorted(BACKENDS)}")
    return BACKENDS[name]


def resolve_backend(name: str, device: torch.device) -> str:
    """The backend "auto" stands for: FlashInfer on CUDA where it is installed, else torch."""
    if name != "auto":
        return name
    return "flashinfer" if device.type == "cuda" and _has_flashinfer() else "torch"


def _has_flashinfer() -> bool:
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return False
    return True
