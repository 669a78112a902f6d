"""Overlap scheduling: the host schedules and launches batch k+1 while the GPU still runs batch k.

After batch k is launched, its requests are advanced optimistically: kv_len moves past the computed tokens
and each sampling request gets a placeholder output token `-(row + 1)`, the row of its token in batch k's
sampled-token tensor, which stays on the GPU. Batch k+1 is then scheduled as if k were done; its input ids
carry the placeholders, which one GPU gather replaces with batch k's tokens in stream order (no host sync).
Only then does the host wait for batch k's tokens, fill in the placeholders, and finish requests.

A request that finishes in batch k was already part of batch k+1: its k+1 row is computed and discarded
(its pages are freed after k+1 was enqueued, and every later batch runs after k+1 on the same stream).
Requests with penalties need their real previous token on the host: while one is pending, the next
batch is scheduled only after batch k's results are in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from skiff.engine.plan import make_plan, plan_to_batch
from skiff.engine.sampler import DeviceSample, sample_device
from skiff.outputs import StepOutput
from skiff.scheduler.request import Req
from skiff.scheduler.scheduler import ScheduleBatch

if TYPE_CHECKING:
    from skiff.engine.engine import Engine


@dataclass
class Launched:
    sample: DeviceSample | None
    rows: list[tuple[int, Req, int]]  # (row in the sampled tokens, request, index of its placeholder)


def resolve_placeholders(ids: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """ids with every -(i + 1) replaced by tokens[i], on the GPU."""
    pending = ids < 0
    return torch.where(pending, tokens[(-ids - 1).clamp_(min=0)], ids)


class OverlapLoop:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.pending: Launched | None = None

    def step(self) -> list[StepOutput]:
        e = self.engine
        outputs, e._finished = e._finished, []
        if self.pending is not None and any(r.params.needs_penalties for _, r, _ in self.pending.rows):
            outputs.extend(self.drain())  # penalties read the previous token on the host
        batch = e.scheduler.schedule()
        for r in e.scheduler.starved:
            e.scheduler.finish(r)
            r.finish_reason = "length"
            outputs.append(e._output(r, [], "length"))
        e.scheduler.starved.clear()
        launched = None
        if batch is not None:
            launched = self._launch(batch)
        if self.pending is not None:
            outputs.extend(self._process(self.pending))
        self.pending = launched
        return outputs

    def drain(self) -> list[StepOutput]:
        if self.pending is None:
            return []
        outputs = self._process(self.pending)
        self.pending = None
        return outputs

    def _launch(self, batch: ScheduleBatch) -> Launched:
        e = self.engine
        plan = make_plan(batch, e.cfg.page_size)
        fb = plan_to_batch(plan, e.cfg.page_size, e.runner.device)
        if self.pending is not None and self.pending.sample is not None and min(plan["ids"]) < 0:
            fb.input_ids = resolve_placeholders(fb.input_ids, self.pending.sample.tokens)
        logits = e.runner.forward(fb)
        sampling = [s for s in batch.seqs if s.samples]
        reqs = [s.req for s in sampling]
        sample = (
            sample_device(
                logits,
                [r.params for r in reqs],
                [r.generator for r in reqs],
                [r.prompt_ids for r in reqs],
                [r.output_ids for r in reqs],
            )
            if reqs
            else None
        )
        for s in batch.seqs:
            r = s.req
            if r.finish_reason is not None:
                continue
            r.kv_len = s.start + s.q_len
            if not r.prompt_cached and r.kv_len >= len(r.prompt_ids):
                r.prompt_cached = True
                e.prompt_tokens += len(r.prompt_ids)
                e.cache_hit_tokens += r.cached_tokens
                e.cache.cache_prompt(r)
        rows = []
        for i, r in enumerate(reqs):
            if r.finish_reason is None:
                r.output_ids.append(-(i + 1))
                rows.append((i, r, len(r.output_ids) - 1))
        return Launched(sample, rows)

    def _process(self, launched: Launched) -> list[StepOutput]:
        e = self.engine
        if launched.sample is None:
            return []
        result = launched.sample.resolve()
        outputs = []
        for i, r, idx in launched.rows:
            if r.finish_reason is not None:
                continue  # finished or aborted after this batch was launched
            token = result.tokens[i]
            r.output_ids[idx] = token
            e.generation_tokens += 1
            lp = [result.logprobs[i]] if result.logprobs is not None and r.params.logprobs else None
            top = (
                [result.top_logprobs[i]]
                if result.top_logprobs is not None and r.params.top_logprobs
                else None
            )
            reason = e._finish_reason(r, token, idx + 1)
            if reason is not None:
                del r.output_ids[idx + 1 :]  # the placeholder of a batch launched after this one
                r.finish_reason = reason  # type: ignore[assignment]
                if any(x is r for x in e.scheduler.running):
                    e.scheduler.finish(r)
                else:
                    e.scheduler.remove(r.rid)
            outputs.append(e._output(r, [token], reason, lp, top, idx + 1))
        return outputs
