"""The engine's counters as the scheduler reports them (torch-free: the API process reads them too)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStats:
    num_running: int
    num_queued: int
    total_pages: int
    free_pages: int
    cached_pages: int
    used_pages: int  # private pages of live requests
    token_usage: float  # share of the pool not free
    cache_hit_tokens: int
    prompt_tokens: int
    generation_tokens: int
    num_preemptions: int
    page_size: int

    @property
    def cache_hit_rate(self) -> float:
        return self.cache_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
