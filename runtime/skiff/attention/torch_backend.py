"""Pure-torch attention over the paged KV pool (CPU and GPU).

Decodes are batched: their KV pages are gathered into a padded [B, L] block and attended in one SDPA call;
on CPU in fp32, Skiff's decode kernel (skiff.kernels.cpu) reads the pages in place instead.
Prefill chunks go one sequence at a time through SDPA with a causal mask offset by the cached prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from skiff.attention.base import AttentionBackend
from skiff.engine.forward_batch import ForwardBatch
from skiff.kernels import cpu as cpu_kernels


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """[T, H, D] -> [1, H, T, D]: CPU SDPA takes its fused (flash) kernel only for 4-D inputs, 2-4x its 3-D path."""
    return x.transpose(0, 1).unsqueeze(0)


def decode_page_table(batch: ForwardBatch) -> torch.Tensor:
    """[num_decode, max pages] int64 page ids of the decode sequences, each row padded with page 0."""
    nd, ps = batch.num_decode, batch.page_size
    max_pages = -(-max(batch.seq_lens[:nd]) // ps)
    table = torch.zeros(nd, max_pages, dtype=torch.int64)
    for i, pages in enumerate(batch.page_tables[:nd]):
        table[i, : len(pages)] = torch.tensor(pages[:max_pages], dtype=torch.int64)
    return table


@dataclass
class _Prefill:
    rows: slice  # token rows of this sequence in the batch
    kv_slots: torch.Tensor | None  # all KV slots of the sequence; None when there is no cached prefix
    mask: torch.Tensor | None  # [q_len, kv_len] bool, None when plain causal applies


class TorchBackend(AttentionBackend):
    def prepare(self, batch: ForwardBatch) -> None:
        device = batch.input_ids.device
        ps = batch.page_size
        self._out_slots = batch.out_slots
        nd = batch.num_decode
        self.num_decode = nd
        self.decode_pages = self.decode_mask = None
        if nd:
            lens = batch.seq_lens[:nd]
            table = decode_page_table(batch)  # page 0 pads: masked below
            max_pages = table.shape[1]
            self.in_place = (
                device.type == "cpu" and self.pool.compute_dtype == torch.float32 and cpu_kernels.available()
            )
            if self.in_place:  # the kernel takes the page table as is: no padding to mask
                self.decode_table, self.decode_lens = table, torch.tensor(lens, dtype=torch.int64)
            else:
                self.decode_pages = table.reshape(-1).to(device)
                self.decode_span = max_pages * ps
                if (
                    min(lens) < self.decode_span
                ):  # mask the tail of each padded row, shaped to broadcast over heads
                    valid = torch.arange(self.decode_span).unsqueeze(0) < torch.tensor(lens).unsqueeze(1)
                    self.decode_mask = valid[:, None, None, :].to(device)
        self.prefills: list[_Prefill] = []
        row = nd
        for i in range(nd, batch.num_seqs):
            q_len, kv_len = batch.q_lens[i], batch.seq_lens[i]
            prefix = kv_len - q_len
            kv_slots = mask = None
            if prefix:
                pages = torch.tensor(batch.page_tables[i], dtype=torch.int64)
                kv_slots = (pages.unsqueeze(-1) * ps + torch.arange(ps)).reshape(-1)[:kv_len].to(device)
                q_pos = torch.arange(prefix, kv_len).unsqueeze(1)
                mask = (torch.arange(kv_len).unsqueeze(0) <= q_pos).to(device)
            self.prefills.append(_Prefill(slice(row, row + q_len), kv_slots, mask))
            row += q_len

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
        self.pool.write(layer, self._out_slots, k, v)
        out = torch.empty_like(q)
        if self.num_decode:
            out[: self.num_decode] = self._decode(q[: self.num_decode], layer)
        k_buf, v_buf = self.pool.k[layer], self.pool.v[layer]
        for p in self.prefills:
            qi = _heads_first(q[p.rows])
            if p.kv_slots is None:
                ki, vi = _heads_first(k[p.rows]), _heads_first(v[p.rows])
                oi = F.scaled_dot_product_attention(
                    qi, ki, vi, is_causal=True, scale=self.scale, enable_gqa=True
                )
            else:
                ki = _heads_first(k_buf.index_select(0, p.kv_slots).to(q.dtype))
                vi = _heads_first(v_buf.index_select(0, p.kv_slots).to(q.dtype))
                oi = F.scaled_dot_product_attention(
                    qi, ki, vi, attn_mask=p.mask, scale=self.scale, enable_gqa=True
                )
            out[p.rows] = oi[0].transpose(0, 1)
        return out

    def _decode(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        b, ps = q.shape[0], self.pool.page_size
        if self.in_place:
            return cpu_kernels.ops().paged_decode_attention(
                q, self.pool.k[layer], self.pool.v[layer], self.decode_table, self.decode_lens, ps, self.scale
            )
        # Gather whole pages (one contiguous block each) rather than single slots: far fewer, larger copies.
        assert self.decode_pages is not None
        k_pages = self.pool.k[layer].view(-1, ps, *self.pool.k[layer].shape[1:])
        v_pages = self.pool.v[layer].view(-1, ps, *self.pool.v[layer].shape[1:])
        keys = (
            k_pages.index_select(0, self.decode_pages)
            .to(q.dtype)
            .view(b, self.decode_span, -1, q.shape[-1])
            .transpose(1, 2)
        )
        values = (
            v_pages.index_select(0, self.decode_pages)
            .to(q.dtype)
            .view(b, self.decode_span, -1, q.shape[-1])
            .transpose(1, 2)
        )
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), keys, values, attn_mask=self.decode_mask, scale=self.scale, enable_gqa=True
        )
        return out.squeeze(2)  # [B, Hq, 1, D] -> [B, Hq, D]
