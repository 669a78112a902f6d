"""Batched sampling with per-request parameters.

Rows are grouped so that the common cases stay vectorised: greedy rows take one argmax; sampled rows share
temperature/top-k/top-p/min-p filtering over the whole batch; only seeded rows draw their noise from their
own generator (so a seed reproduces the same text whatever else is in the batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from skiff.kernels import cpu as cpu_kernels
from skiff.layers import fused
from skiff.params import SamplingParams

if TYPE_CHECKING:
    from skiff.scheduler.request import Req


@dataclass
class SampleResult:
    tokens: list[int]
    logprobs: list[float] | None  # per row, of the chosen token under the model's distribution
    top_logprobs: list[dict[int, float]] | None


def apply_penalties(
    logits: torch.Tensor, params: list[SamplingParams], prompts: list[list[int]], outputs: list[list[int]]
) -> None:
    """In place. Repetition penalty (HF style) over prompt + output; presence/frequency over the output."""
    for i, p in enumerate(params):
        if not p.needs_penalties:
            continue
        row = logits[i]
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(
                sorted(set(prompts[i]) | set(outputs[i])), dtype=torch.long, device=row.device
            )
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


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Row argmax; on CPU through Skiff's kernel (torch's CPU argmax does not vectorize)."""
    return cpu_kernels.ops().argmax_rows(logits) if cpu_kernels.usable(logits) else logits.argmax(dim=-1)


@dataclass(frozen=True)
class SampleInputs:
    """Per sampled row: its parameters, seeded generator, prompt and output so far (for penalties)."""

    params: list[SamplingParams]
    generators: list[torch.Generator | None]
    prompts: list[list[int]]
    outputs: list[list[int]]

    @classmethod
    def of(cls, reqs: Sequence[Req]) -> SampleInputs:
        return cls(
            [r.params for r in reqs],
            [r.generator for r in reqs],
            [r.prompt_ids for r in reqs],
            [r.output_ids for r in reqs],
        )


def _penalized(logits: torch.Tensor, inputs: SampleInputs) -> torch.Tensor:
    if not any(p.needs_penalties for p in inputs.params):
        return logits
    logits = logits.clone()  # an inference tensor (and maybe a CUDA graph's output): not updated in place
    apply_penalties(logits, inputs.params, inputs.prompts, inputs.outputs)
    return logits


def _raw_logprobs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor | None:
    return torch.log_softmax(logits, dim=-1) if any(p.logprobs or p.top_logprobs for p in params) else None


def _result(
    tokens: torch.Tensor,
    host_tokens: list[int],
    raw_logprobs: torch.Tensor | None,
    params: list[SamplingParams],
) -> SampleResult:
    if raw_logprobs is None:
        return SampleResult(host_tokens, None, None)
    chosen = raw_logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
    tops: list[dict[int, float]] = [{} for _ in host_tokens]
    width = max(p.top_logprobs for p in params)
    if width:
        values, ids = raw_logprobs.topk(width, dim=-1)
        for i, p in enumerate(params):
            if p.top_logprobs:
                n = p.top_logprobs
                tops[i] = dict(zip(ids[i, :n].tolist(), values[i, :n].tolist(), strict=True))
    return SampleResult(host_tokens, chosen, tops)


def sample(logits: torch.Tensor, inputs: SampleInputs, unmasked: torch.Tensor | None = None) -> SampleResult:
    """The CPU sampler. logits: [N, V] float32; `unmasked`: the logits before grammar masks, which
    logprobs report (the model's distribution, as vLLM and SGLang report it)."""
    params = inputs.params
    raw_logprobs = _raw_logprobs(logits if unmasked is None else unmasked, params)
    logits = _penalized(logits, inputs)
    tokens = greedy_tokens(logits)
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if sampled:
        idx = torch.tensor(sampled, device=logits.device)
        probs = _filter(logits[idx], [params[i] for i in sampled])
        noise = torch.empty_like(probs)
        for row, i in enumerate(sampled):
            noise[row].exponential_(generator=inputs.generators[i])
        # exponential race: argmax p_i / E_i with E_i ~ Exp(1) draws i with probability p_i
        tokens[idx] = (probs / noise).argmax(dim=-1)
    return _result(tokens, tokens.tolist(), raw_logprobs, params)


@dataclass
class HostSample:
    """A sample already on the host (the CPU sampler's), with the interface of a pending DeviceSample."""

    result: SampleResult

    @property
    def tokens(self) -> torch.Tensor:
        return torch.tensor(self.result.tokens, dtype=torch.int64)

    def resolve(self) -> SampleResult:
        return self.result


# ------------------------------------------------------------------------------------------ GPU path
def to_device(values: list[float] | list[int], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Host list -> device tensor without a stream sync (torch.tensor(..., device=cuda) would sync)."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def _scaled(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """logits / T without host syncs: a shared temperature divides by a scalar."""
    temps = [p.temperature for p in params]
    if len(set(temps)) == 1:
        return logits / temps[0]
    return logits / to_device(temps, logits.device, logits.dtype).unsqueeze(1)


def _scaled_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    return torch.softmax(_scaled(logits, params), dim=-1)


@dataclass
class DeviceSample:
    """Sampled tokens kept on the GPU (the next batch reads them there) and copied to pinned host memory."""

    tokens: torch.Tensor  # [N] int64 on the device
    host: torch.Tensor  # [N] int64 pinned
    done: torch.cuda.Event | None  # None on the CPU, where tokens are ready at once
    logprobs: torch.Tensor | None
    params: list[SamplingParams]

    def resolve(self) -> SampleResult:
        if self.done is not None:
            self.done.synchronize()
        return _result(self.tokens, self.host.tolist(), self.logprobs, self.params)


def sample_device(
    logits: torch.Tensor, inputs: SampleInputs, unmasked: torch.Tensor | None = None
) -> DeviceSample:
    """The GPU sampler: same distribution as `sample`, one noise draw for unseeded rows, no host sync."""
    params, generators = inputs.params, inputs.generators
    raw_logprobs = _raw_logprobs(logits if unmasked is None else unmasked, params)
    logits = _penalized(logits, inputs)
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if len(sampled) == len(params):
        tokens = _sample_rows(logits, params, generators)
    else:
        tokens = greedy_tokens(logits)
        if sampled:
            idx = to_device(sampled, logits.device, torch.int64)
            rows = _sample_rows(
                logits.index_select(0, idx), [params[i] for i in sampled], [generators[i] for i in sampled]
            )
            tokens.index_copy_(0, idx, rows)
    if not tokens.is_cuda:
        return DeviceSample(tokens, tokens, None, raw_logprobs, params)
    host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
    host.copy_(tokens, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return DeviceSample(tokens, host, done, raw_logprobs, params)


def _sample_rows(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> torch.Tensor:
    unseeded = all(g is None for g in generators)
    truncated = any(p.top_k > 0 for p in params) or any(p.top_p < 1.0 for p in params)
    if truncated and unseeded and not any(p.min_p > 0 for p in params):
        fi = fused._flashinfer()
        if fi is not None:  # FlashInfer's rejection sampler: top-k/top-p without sorting the vocabulary
            vocab = logits.shape[-1]
            ks = to_device([p.top_k if p.top_k > 0 else vocab for p in params], logits.device, torch.int32)
            ps = to_device([p.top_p for p in params], logits.device, torch.float32)
            return fi.top_k_top_p_sampling_from_probs(_scaled_probs(logits, params), ks, ps).long()
    if unseeded and not truncated and not any(p.min_p > 0 for p in params):
        fi = fused._flashinfer()
        if fi is not None and logits.is_cuda:  # one fused kernel instead of softmax, noise, divide and argmax
            return fi.sampling_from_logits(_scaled(logits, params)).long()
    if truncated or any(p.min_p > 0 for p in params):
        probs = _filter(logits, params)  # sort-based filtering, as on the CPU
    else:
        probs = _scaled_probs(logits, params)
    if unseeded:
        noise = torch.empty_like(probs).exponential_()
    else:
        noise = torch.empty_like(probs)
        for row, g in enumerate(generators):
            noise[row].exponential_(generator=g)
    return (probs / noise).argmax(dim=-1)
