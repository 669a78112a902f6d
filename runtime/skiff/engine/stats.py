"""The engine's counters as the scheduler reports them (torch-free: the API process reads them too)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStats:
    num_running: int = 0
    num_queued: int = 0
    total_pages: int = 0
    free_pages: int = 0
    cached_pages: int = 0
    used_pages: int = 0  # private pages of live requests
    token_usage: float = 0.0  # share of the pool not free
    cache_hit_tokens: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_preemptions: int = 0
    page_size: int = 0

    @property
    def cache_hit_rate(self) -> float:
        return self.cache_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
