"""Req: one generation request as the scheduler sees it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from skiff.outputs import FinishReason
from skiff.params import SamplingParams


@dataclass(eq=False)
class Req:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: int
    output_ids: list[int] = field(default_factory=list)
    # KV state: pages[i] holds positions [i*ps, (i+1)*ps); the first cached_pages belong to the prefix cache
    pages: list[int] = field(default_factory=list)
    cached_pages: int = 0
    node: Any = None  # the prefix-cache lock handle
    kv_len: int = 0  # positions whose KV is in the pool
    prompt_cached: bool = False  # the prompt's pages were offered to the prefix cache
    cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    admitted: bool = False
    num_retractions: int = 0
    generator: torch.Generator | None = None
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    matched_stop: int | str | None = None
    matcher: Any = None  # the grammar's llguidance matcher, for a constrained request
    queued_ns: int = 0  # epoch ns it began to wait for the engine (outputs.RequestTiming)
    scheduled_ns: int = 0  # epoch ns of its first admission to a batch

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def remaining(self) -> int:
        """Tokens whose KV must still be computed before the next token can be sampled."""
        return self.seq_len - self.kv_len
