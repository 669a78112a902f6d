"""The paged KV pool: one K and one V buffer per layer, addressed by slot = page * page_size + offset.

Pages are the unit of allocation; a request's page list is its page table. The allocator only hands out
page ids; which pages are cached (radix tree) or in use (requests) is tracked by the cache manager.
"""

from __future__ import annotations

import torch


class KVPool:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        self.dtype = dtype  # what the pool stores
        self.compute_dtype = compute_dtype or dtype  # what the model writes and attention computes in
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_slots = num_pages * page_size
        shape = (self.num_slots, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer].index_copy_(0, slots, k.to(self.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.dtype))


class PageAllocator:
    """Free list of page ids. Page 0 is never handed out: padded slots of a batch point at it."""

    def __init__(self, num_pages: int) -> None:
        self.total = num_pages - 1
        self._free = list(range(num_pages - 1, 0, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        if n == 0:
            return []
        out = self._free[-n:]
        del self._free[-n:]
        return out

    def free(self, pages: list[int]) -> None:
        self._free.extend(pages)
