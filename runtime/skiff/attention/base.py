"""The attention backend interface and its registry.

A backend is bound to the KV pool. For each forward batch the runner calls `prepare(batch)` once, then every
layer calls `forward(q, k, v, layer)`, which must write k/v of the new tokens into the pool at
`batch.out_slots` and return attention over each sequence's whole context (cached prefix + new tokens).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from skiff.engine.forward_batch import ForwardBatch
    from skiff.kvcache.pool import KVPool


class AttentionBackend(ABC):
    def __init__(self, pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        self.pool = pool
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5

    @abstractmethod
    def prepare(self, batch: ForwardBatch) -> None: ...

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        """q: [T, Hq, D], k/v: [T, Hkv, D] -> [T, Hq, D]"""


BackendFactory = Callable[..., AttentionBackend]
BACKENDS: dict[str, Callable[[], type[AttentionBackend]]] = {}


def register_backend(name: str, loader: Callable[[], type[AttentionBackend]]) -> None:
    BACKENDS[name] = loader


def get_backend(name: str) -> type[AttentionBackend]:
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {sorted(BACKENDS)}")
    return BACKENDS[name]()


def _torch() -> type[AttentionBackend]:
    from skiff.attention.torch_backend import TorchBackend

    return TorchBackend


def _flashinfer() -> type[AttentionBackend]:
    from skiff.attention.flashinfer_backend import FlashInferBackend

    return FlashInferBackend


register_backend("torch", _torch)
register_backend("flashinfer", _flashinfer)
