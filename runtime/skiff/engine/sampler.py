"""Batched sampling with per-request parameters.

Rows are grouped so that the common cases stay vectorised: greedy rows take one argmax; sampled rows share
temperature/top-k/top-p/min-p filtering over the whole batch; only seeded rows draw their noise from their
own generator (so a seed reproduces the same text whatever else is in the batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from skiff.params import SamplingParams


@dataclass
class SampleResult:
    tokens: list[int]
    logprobs: list[float] | None  # per row, of the chosen token under the model's distribution
    top_logprobs: list[dict[int, float]] | None


def apply_penalties(logits: torch.Tensor, params: list[SamplingParams], prompts: list[list[int]],
                    outputs: list[list[int]]) -> None:
    """In place. Repetition penalty (HF style) over prompt + output; presence/frequency over the output."""
    for i, p in enumerate(params):
        if not p.needs_penalties:
            continue
        row = logits[i]
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(prompts[i]) | set(outputs[i])), dtype=torch.long, device=row.device)
            vals = row[seen]
            row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if outputs[i] and (p.presence_penalty or p.frequency_penalty):
            ids, counts = torch.tensor(outputs[i], device=row.device).unique(return_counts=True)
            row[ids] -= p.frequency_penalty * counts.to(row.dtype) + p.presence_penalty


def _filter(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p over rows that sample; returns probabilities."""
    device = logits.device
    temps = torch.tensor([p.temperature for p in params], device=device).unsqueeze(1)
    probs = torch.softmax(logits / temps, dim=-1)
    top_ks = [p.top_k for p in params]
    top_ps = [p.top_p for p in params]
    min_ps = [p.min_p for p in params]
    if any(k > 0 for k in top_ks) or any(tp < 1.0 for tp in top_ps):
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        vocab = probs.shape[-1]
        k = torch.tensor([k if k > 0 else vocab for k in top_ks], device=device).unsqueeze(1)
        rank = torch.arange(vocab, device=device).unsqueeze(0)
        cum_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        keep = (rank < k) & (cum_before < torch.tensor(top_ps, device=device).unsqueeze(1))
        keep[:, 0] = True
        sorted_probs = sorted_probs.masked_fill(~keep, 0.0)
        probs = torch.zeros_like(probs).scatter_(1, order, sorted_probs)
    if any(m > 0 for m in min_ps):
        threshold = probs.max(dim=-1, keepdim=True).values * torch.tensor(min_ps, device=device).unsqueeze(1)
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
           prompts: list[list[int]], outputs: list[list[int]]) -> SampleResult:
    """logits: [N, V] float32 (modified in place by penalties)."""
    n = logits.shape[0]
    want_logprobs = any(p.logprobs or p.top_logprobs for p in params)
    raw_logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
    if any(p.needs_penalties for p in params):
        apply_penalties(logits, params, prompts, outputs)
    tokens = logits.argmax(dim=-1)
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if sampled:
        idx = torch.tensor(sampled, device=logits.device)
        probs = _filter(logits[idx], [params[i] for i in sampled])
        noise = torch.empty_like(probs)
        for row, i in enumerate(sampled):
            noise[row].exponential_(generator=generators[i])
        # exponential race: argmax p_i / E_i with E_i ~ Exp(1) draws i with probability p_i
        tokens[idx] = (probs / noise).argmax(dim=-1)
    token_list = tokens.tolist()
    if raw_logprobs is None:
        return SampleResult(token_list, None, None)
    chosen = raw_logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
    tops: list[dict[int, float]] = [{} for _ in range(n)]
    width = max(p.top_logprobs for p in params)
    if width:
        values, ids = raw_logprobs.topk(width, dim=-1)
        for i, p in enumerate(params):
            if p.top_logprobs:
                tops[i] = dict(zip(ids[i, : p.top_logprobs].tolist(), values[i, : p.top_logprobs].tolist(), strict=True))
    return SampleResult(token_list, chosen, tops)
