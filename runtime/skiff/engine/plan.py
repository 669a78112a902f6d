"""The per-step plan: what rank 0 scheduled, as plain token ids and slots, and its ForwardBatch.

Rank 0 alone schedules and samples; the other TP ranks replay the same forward from this plan (their
collectives pair up with rank 0's), so every rank writes the same KV slots. A negative input id is an
overlap placeholder: -(i + 1) stands for row i of the previous batch's sampled tokens (engine.py).
"""

from __future__ import annotations

import msgspec
import torch

from skiff.engine.forward_batch import ForwardBatch, slots_for
from skiff.scheduler.scheduler import ScheduleBatch


class StepPlan(msgspec.Struct, frozen=True, array_like=True, tag="step"):
    ids: list[int]  # input token ids, decode rows first
    positions: list[int]
    slots: list[int]  # KV-pool slot of each input token
    logit_rows: list[int]  # rows of ids whose next-token logits are needed
    q_lens: list[int]
    seq_lens: list[int]
    page_tables: list[list[int]]
    num_decode: int


class StopFollowers(msgspec.Struct, frozen=True, array_like=True, tag="stop"):
    """Rank 0 -> followers: the engine shuts down."""


FollowerMessage = StepPlan | StopFollowers


def make_plan(batch: ScheduleBatch, page_size: int) -> StepPlan:
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
    return StepPlan(
        ids=ids,
        positions=positions,
        slots=slots,
        logit_rows=rows,
        q_lens=[s.q_len for s in batch.seqs],
        seq_lens=[s.start + s.q_len for s in batch.seqs],
        page_tables=[s.req.pages for s in batch.seqs],
        num_decode=batch.num_decode,
    )


def prompt_plan(token_ids: list[int], pages: list[int], page_size: int) -> StepPlan:
    """One prefill of a whole prompt with logits at every position."""
    n = len(token_ids)
    return StepPlan(
        ids=list(token_ids),
        positions=list(range(n)),
        slots=slots_for(pages, 0, n, page_size),
        logit_rows=list(range(n)),
        q_lens=[n],
        seq_lens=[n],
        page_tables=[pages],
        num_decode=0,
    )


def plan_to_batch(plan: StepPlan, page_size: int, device: torch.device) -> ForwardBatch:
    """One host buffer, one copy (pinned and asynchronous on CUDA: the host never waits for the GPU here)."""
    n, r = len(plan.ids), len(plan.logit_rows)
    host = torch.tensor(plan.ids + plan.positions + plan.slots + plan.logit_rows, dtype=torch.int64)
    dev = host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host.to(device)
    return ForwardBatch(
        input_ids=dev[:n],
        positions=dev[n : 2 * n],
        out_slots=dev[2 * n : 3 * n],
        q_lens=plan.q_lens,
        seq_lens=plan.seq_lens,
        page_tables=plan.page_tables,
        num_decode=plan.num_decode,
        logit_rows=dev[3 * n : 3 * n + r],
        page_size=page_size,
    )
