"""CUDA graphs for decode batches: one graph per padded batch size, all in one memory pool.

Sizes are 1, 2, 4, 8, then every 8 up to `cuda_graph_max_bs`. A decode batch of n sequences replays the
graph of the smallest size >= n; the padding rows are one-token sequences on page 0 (the pool's padding page,
never handed out), so their KV writes and reads touch nothing live. Graphs are captured largest first, after
two eager warm-up runs per size (FlashInfer JIT, cuBLAS workspaces), so the smaller ones reuse its memory.
"""

from __future__ import annotations

import bisect
import logging
import time
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch import nn

    from skiff.attention.base import AttentionBackend
    from skiff.engine.forward_batch import ForwardBatch

log = logging.getLogger(__name__)


def graph_batch_sizes(max_bs: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s <= max_bs] + list(range(16, max_bs + 1, 8))
    if max_bs > 8 and sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


class DecodeGraphs:
    """Decode graphs of `model` (forward(ids, positions, backend) and compute_logits) over `backend`."""

    def __init__(
        self,
        model: nn.Module,
        backend: AttentionBackend,
        device: torch.device,
        max_bs: int,
        max_pages_per_seq: int,
    ) -> None:
        self.model = model
        self.backend = backend
        self.sizes = graph_batch_sizes(max_bs)
        self.max_bs = self.sizes[-1]
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.slots = torch.zeros(self.max_bs, dtype=torch.int64, device=device)  # slot 0: the padding page
        self.backend.init_graphs(self.max_bs, max_pages_per_seq)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.capture_seconds = 0.0

    def _run(self, bs: int) -> torch.Tensor:
        hidden = self.model(self.input_ids[:bs], self.positions[:bs], self.backend)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for bs in reversed(self.sizes):
                self.backend.prepare_capture(bs, self.slots[:bs])
                for _ in range(2):
                    self._run(bs)
                stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.logits[bs] = self._run(bs)
                self.graphs[bs] = graph
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - t0
        log.info(
            "captured %d decode CUDA graphs (bs %d..%d) in %.1f s",
            len(self.sizes),
            self.sizes[0],
            self.max_bs,
            self.capture_seconds,
        )

    def can_run(self, batch: ForwardBatch) -> bool:
        return batch.is_decode and batch.num_seqs <= self.max_bs

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        n = batch.num_seqs
        bs = self.sizes[bisect.bisect_left(self.sizes, n)]
        self.input_ids[:n].copy_(batch.input_ids, non_blocking=True)
        self.positions[:n].copy_(batch.positions, non_blocking=True)
        self.slots[:n].copy_(batch.out_slots, non_blocking=True)
        if bs > n:
            self.slots[n:bs].zero_()
        self.backend.prepare_replay(bs, self.slots[:bs], batch.seq_lens, batch.page_tables)
        self.graphs[bs].replay()
        logits = self.logits[bs]
        if batch.logit_rows.shape[0] == n:  # every decode row samples
            return logits[:n]
        return logits.index_select(0, batch.logit_rows)
