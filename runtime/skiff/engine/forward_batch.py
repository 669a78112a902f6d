"""ForwardBatch: everything one model forward needs, built by the scheduler, read by the runner and backend.

Sequences are ordered decode first (q_len == 1), then prefill chunks; token rows follow the same order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_slots: torch.Tensor  # [T] int64: KV-pool slot of each new token
    q_lens: list[int]  # new tokens per sequence
    seq_lens: list[int]  # KV length per sequence after this forward (cached prefix + new tokens)
    page_tables: list[list[int]]  # per sequence, the pages covering seq_lens
    num_decode: int  # the first num_decode sequences are single-token decodes
    logit_rows: torch.Tensor  # [N] rows of T whose next-token logits are needed
    page_size: int

    @property
    def num_seqs(self) -> int:
        return len(self.q_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_decode(self) -> bool:
        return self.num_decode == self.num_seqs


def slots_for(pages: list[int], start: int, end: int, page_size: int) -> list[int]:
    """KV slots of positions [start, end) of a sequence whose page table is `pages`."""
    return [pages[p // page_size] * page_size + p % page_size for p in range(start, end)]
