"""FlashInfer attention over the paged KV pool (GPU).

The pool's per-layer [num_slots, kv_heads, head_dim] buffers are FlashInfer's NHD paged layout viewed as
[num_pages, page_size, kv_heads, head_dim]. Decode-only batches go through the tensor-core decode wrapper;
any batch with a prefill chunk (decode rows first, then chunks) goes through the paged prefill wrapper,
causal with the query block aligned to the end of each sequence's KV, so chunks attend to their cached prefix.

`plan()` stages its schedule through a pinned host buffer owned by the wrapper and copies it to the GPU
asynchronously. With overlap scheduling the host plans batch k+1 while that copy of batch k may still wait
in the stream; rewriting the buffer then corrupts batch k's plan. Each wrapper therefore records an event
after its plan and the next plan of the same wrapper waits for it (the wait is almost always already over).
"""

from __future__ import annotations

import os
from itertools import accumulate, chain
from typing import TYPE_CHECKING, Any

import torch

from skiff.attention.base import AttentionBackend

if TYPE_CHECKING:
    from skiff.engine.forward_batch import ForwardBatch
    from skiff.kvcache.pool import KVPool

WORKSPACE_BYTES = 256 * 2**20


def paged_metadata(
    seq_lens: list[int],
    tables: list[list[int]],
    page_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CSR page tables on the host: (indptr [B+1], indices [nnz], last_page_len [B]), int32."""
    counts = [-(-n // page_size) for n in seq_lens]
    indptr = [0, *accumulate(counts)]
    indices = list(chain.from_iterable(t[:c] for t, c in zip(tables, counts, strict=True)))
    last = [n - (c - 1) * page_size for n, c in zip(seq_lens, counts, strict=True)]
    return _pinned(indptr), _pinned(indices), _pinned(last)


def _pinned(values: list[int]) -> torch.Tensor:
    """Host int32 tensor in pinned memory: its copies to the GPU are truly asynchronous (no stream sync)."""
    t = torch.tensor(values, dtype=torch.int32)
    return t.pin_memory() if torch.cuda.is_available() else t


class FlashInferBackend(AttentionBackend):
    supports_cuda_graphs = True

    def __init__(self, pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__(pool, num_heads, num_kv_heads, head_dim)
        import flashinfer

        self.fi = flashinfer
        self.device = pool.k[0].device
        self.dtype = pool.k[0].dtype
        self.page_size = pool.page_size
        shape = (pool.num_pages, pool.page_size, num_kv_heads, head_dim)
        self.kv = [(k.view(shape), v.view(shape)) for k, v in zip(pool.k, pool.v, strict=True)]
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend=os.environ.get("SKIFF_FLASHINFER_PREFILL", "fa2")
        )
        self.decode_wrapper = self._decode_wrapper()
        self._fences: dict[int, torch.cuda.Event] = {}
        self._active: Any = None
        self._slots: torch.Tensor | None = None
        self._graph_bufs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._graph_wrappers: dict[int, Any] = {}

    def _decode_wrapper(self, graph_bs: int | None = None) -> Any:
        if graph_bs is None:
            return self.fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_tensor_cores=True, backend="fa2"
            )
        assert self._graph_bufs is not None
        indptr, indices, last = self._graph_bufs
        return self.fi.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=indptr[: graph_bs + 1],
            paged_kv_indices_buffer=indices,
            paged_kv_last_page_len_buffer=last[:graph_bs],
            backend="fa2",
        )

    # ------------------------------------------------------------------------------------------ planning
    def _plan(self, wrapper: Any, *csr: torch.Tensor, **options: Any) -> None:
        """wrapper.plan over the CSR page tables `csr`, with this model's heads, page size and dtypes."""
        fence = self._fences.get(id(wrapper))
        if fence is not None:
            fence.synchronize()  # the previous plan's pinned-buffer copy has left the host buffer
        wrapper.plan(
            *csr,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.page_size,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
            sm_scale=self.scale,
            **options,
        )
        event = torch.cuda.Event()
        event.record()
        self._fences[id(wrapper)] = event

    def _plan_decode(self, wrapper: Any, seq_lens: list[int], tables: list[list[int]]) -> None:
        indptr, indices, last = paged_metadata(seq_lens, tables, self.page_size)
        if (
            wrapper is not self.decode_wrapper
        ):  # graph wrappers copy host indices synchronously: use device ones
            indices = indices.to(self.device, non_blocking=True)
        self._plan(wrapper, indptr, indices, last)

    def prepare(self, batch: ForwardBatch) -> None:
        self._slots = batch.out_slots
        if batch.is_decode:
            self._plan_decode(self.decode_wrapper, batch.seq_lens, batch.page_tables)
            self._active = self.decode_wrapper
            return
        indptr, indices, last = paged_metadata(batch.seq_lens, batch.page_tables, self.page_size)
        qo_indptr = _pinned([0, *accumulate(batch.q_lens)])
        self._plan(self.prefill_wrapper, qo_indptr, indptr, indices, last, causal=True)
        self._active = self.prefill_wrapper

    # ------------------------------------------------------------------------------------------ CUDA graphs
    def init_graphs(self, max_bs: int, max_pages_per_seq: int) -> None:
        i32 = torch.int32
        self._graph_bufs = (
            torch.zeros(max_bs + 1, dtype=i32, device=self.device),
            torch.zeros(max_bs * max_pages_per_seq, dtype=i32, device=self.device),
            torch.ones(max_bs, dtype=i32, device=self.device),
        )

    def prepare_capture(self, bs: int, slots: torch.Tensor) -> None:
        self.prepare_replay(bs, slots, [], [])

    def prepare_replay(
        self, bs: int, slots: torch.Tensor, seq_lens: list[int], page_tables: list[list[int]]
    ) -> None:
        """Rows past the real batch are one-token sequences on page 0."""
        wrapper = self._graph_wrappers.get(bs)
        if wrapper is None:
            wrapper = self._graph_wrappers[bs] = self._decode_wrapper(bs)
        pad = bs - len(seq_lens)
        self._plan_decode(wrapper, list(seq_lens) + [1] * pad, list(page_tables) + [[0]] * pad)
        self._active = wrapper
        self._slots = slots

    # ------------------------------------------------------------------------------------------ forward
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        assert self._slots is not None
        self.pool.write(layer, self._slots, k, v)
        return self._active.run(q.contiguous(), self.kv[layer])
