"""The per-step plan rank 0 sends to the other TP ranks, and its conversion into a ForwardBatch.

Rank 0 alone schedules and samples; the other ranks replay the same forward from this plan (their
collectives pair up with rank 0's), so every rank writes the same KV slots.
"""

from __future__ import annotations

from typing import Any

import torch

from skiff.engine.forward_batch import ForwardBatch, slots_for
from skiff.scheduler.scheduler import ScheduleBatch


def make_plan(batch: ScheduleBatch, page_size: int) -> dict[str, Any]:
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    rows: list[int] = []
    for s in batch.seqs:
        r = s.req
        end = s.start + s.q_len
        if s.q_len == 1 and r.output_ids and s.start == r.seq_len - 1:
            ids.append(r.output_ids[-1])
        else:
            ids.extend(r.all_ids[s.start : end])
        positions.extend(range(s.start, end))
        slots.extend(slots_for(r.pages, s.start, end, page_size))
        if s.samples:
            rows.append(len(ids) - 1)
    return {
        "op": "forward",
        "ids": ids,
        "pos": positions,
        "slots": slots,
        "rows": rows,
        "q_lens": [s.q_len for s in batch.seqs],
        "seq_lens": [s.start + s.q_len for s in batch.seqs],
        "tables": [s.req.pages for s in batch.seqs],
        "nd": batch.num_decode,
    }


def plan_to_batch(plan: dict[str, Any], page_size: int, device: torch.device) -> ForwardBatch:
    if device.type == "cuda":
        return _plan_to_cuda_batch(plan, page_size, device)

    def t(xs: list[int]) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.int64).to(device, non_blocking=True)

    return ForwardBatch(
        input_ids=t(plan["ids"]),
        positions=t(plan["pos"]),
        out_slots=t(plan["slots"]),
        q_lens=plan["q_lens"],
        seq_lens=plan["seq_lens"],
        page_tables=plan["tables"],
        num_decode=plan["nd"],
        logit_rows=t(plan["rows"]),
        page_size=page_size,
    )


def _plan_to_cuda_batch(plan: dict[str, Any], page_size: int, device: torch.device) -> ForwardBatch:
    """One pinned host buffer, one asynchronous copy: the host never waits for the GPU here."""
    n, r = len(plan["ids"]), len(plan["rows"])
    host = torch.tensor(
        plan["ids"] + plan["pos"] + plan["slots"] + plan["rows"], dtype=torch.int64
    ).pin_memory()
    dev = host.to(device, non_blocking=True)
    return ForwardBatch(
        input_ids=dev[:n],
        positions=dev[n : 2 * n],
        out_slots=dev[2 * n : 3 * n],
        q_lens=plan["q_lens"],
        seq_lens=plan["seq_lens"],
        page_tables=plan["tables"],
        num_decode=plan["nd"],
        logit_rows=dev[3 * n : 3 * n + r],
        page_size=page_size,
    )
