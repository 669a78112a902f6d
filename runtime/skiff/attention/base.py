"""The attention backend interface.

A backend is bound to the KV pool. For each forward batch the runner calls `prepare(batch)` once, then every
layer calls `forward(q, k, v, layer)`, which must write k/v of the new tokens into the pool at
`batch.out_slots` and return attention over each sequence's whole context (cached prefix + new tokens).

Backends that set `supports_cuda_graphs` also implement the decode-graph hooks: `init_graphs` once, then
`prepare_capture` before a graph of batch size bs is captured and `prepare_replay` before it replays. Those
hooks plan on fixed device buffers, so the captured kernels read each replay's metadata in place.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

import torch

if TYPE_CHECKING:
    from skiff.engine.forward_batch import ForwardBatch
    from skiff.kvcache.pool import KVPool


class AttentionBackend(ABC):
    supports_cuda_graphs: ClassVar[bool] = False

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

    # ------------------------------------------------------------------------------------------ CUDA graphs
    def init_graphs(self, max_bs: int, max_pages_per_seq: int) -> None:
        """Allocate the device buffers shared by every captured batch size (one graph replays at a time)."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def prepare_capture(self, bs: int, slots: torch.Tensor) -> None:
        """Plan a decode batch of bs placeholder rows writing KV at `slots` (device [bs]), for capture."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def prepare_replay(
        self, bs: int, slots: torch.Tensor, seq_lens: list[int], page_tables: list[list[int]]
    ) -> None:
        """Plan the real decode rows (len(seq_lens) <= bs) into the buffers the graph of size bs reads."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")
