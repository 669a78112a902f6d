"""Continuous batching with chunked prefill, mixed prefill+decode batches and optimistic admission.

Each step: every running request that needs one token (decode) gets it first; the rest of the token budget
goes to unfinished prefill chunks, then to new requests. Admission reserves only what the next chunk needs
(plus a page of headroom per running request), not max_tokens: when decode later runs out of pages, the
newest requests are retracted to the queue, their computed prefix left in the radix cache for the retry.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

from skiff.config import EngineConfig
from skiff.kvcache.manager import NaiveCacheManager
from skiff.scheduler.request import Req


@dataclass
class ScheduledSeq:
    req: Req
    start: int  # kv_len before this step
    q_len: int

    @property
    def samples(self) -> bool:
        return self.start + self.q_len == self.req.seq_len


@dataclass
class ScheduleBatch:
    seqs: list[ScheduledSeq]
    num_decode: int


class Scheduler:
    def __init__(self, cfg: EngineConfig, cache: NaiveCacheManager) -> None:
        self.cfg = cfg
        self.cache = cache
        self.ps = cache.page_size
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.num_retractions = 0
        self.starved: list[Req] = []

    def _order(self, r: Req) -> tuple[int, int]:
        return (-r.params.priority, r.arrival) if self.cfg.schedule_policy == "priority" else (0, r.arrival)

    def enqueue(self, req: Req) -> None:
        keys = [self._order(r) for r in self.waiting]
        self.waiting.insert(bisect.bisect(keys, self._order(req)), req)

    def remove(self, rid: str) -> Req | None:
        for queue in (self.waiting, self.running):
            for r in queue:
                if r.rid == rid:
                    queue.remove(r)
                    if r.admitted and queue is self.running:
                        self.cache.release(r)
                    return r
        return None

    def _pages_needed(self, r: Req, n: int) -> int:
        return max(0, -(-(r.kv_len + n) // self.ps) - len(r.pages))

    def _grow(self, r: Req, n: int) -> None:
        pages = self.cache.alloc(self._pages_needed(r, n))
        assert pages is not None, "page allocation after a successful availability check failed"
        r.pages.extend(pages)

    def _retract_newest(self) -> Req | None:
        if len(self.running) <= 1:
            return None
        victim = max(self.running, key=lambda r: r.arrival)
        self.running.remove(victim)
        self.cache.release(victim)
        victim.num_retractions += 1
        self.num_retractions += 1
        self.enqueue(victim)
        return victim

    def schedule(self) -> ScheduleBatch | None:
        budget = self.cfg.chunked_prefill_size
        decodes = [r for r in self.running if r.remaining == 1]
        # Decode first: retract the newest requests until every remaining decode has its next page.
        while decodes and sum(self._pages_needed(r, 1) for r in decodes) > self.cache.available_pages:
            victim = self._retract_newest()
            if victim is None:
                break
            decodes = [r for r in decodes if r is not victim]
        seqs: list[ScheduledSeq] = []
        for r in decodes:
            if self._pages_needed(r, 1) > self.cache.available_pages:
                self.starved.append(r)  # a lone request that outgrew the whole pool: the engine ends it
                continue
            self._grow(r, 1)
            seqs.append(ScheduledSeq(r, r.kv_len, 1))
        num_decode = len(seqs)
        budget -= num_decode
        # Unfinished prefill chunks of admitted requests.
        for r in self.running:
            if r.remaining > 1 and budget > 0:
                n = self._fit(r, min(r.remaining, budget), headroom=0)
                if n:
                    self._grow(r, n)
                    seqs.append(ScheduledSeq(r, r.kv_len, n))
                    budget -= n
        # New (or retracted) requests, in queue order; a prompt whose twin is being prefilled waits for
        # the twin's pages to reach the prefix cache (n > 1 choices prefill their prompt once).
        deferred: list[Req] = []
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_running_requests:
            r = self.waiting[0]
            if self._twin_prefilling(r):
                deferred.append(self.waiting.pop(0))
                continue
            self.cache.match(r)
            headroom = len(self.running)
            n = self._fit(r, min(r.remaining, budget), headroom)
            if n == 0 or (n < r.remaining and n < min(budget, 16) and self.running):
                self.cache.release(r)
                break
            self.waiting.pop(0)
            if not r.admitted:
                r.admitted, r.cached_tokens, r.scheduled_ns = True, r.kv_len, time.time_ns()
            self.running.append(r)
            self._grow(r, n)
            seqs.append(ScheduledSeq(r, r.kv_len, n))
            budget -= n
        self.waiting[:0] = deferred
        if not seqs and self.running and not self.starved:
            # Every running request is mid-prefill and the pool is full: free room by retracting the
            # newest one, or give up on a lone request that cannot fit at all.
            if self._retract_newest() is None:
                self.starved.append(self.running[0])
                return None
            return self.schedule()
        return ScheduleBatch(seqs, num_decode) if seqs else None

    def _twin_prefilling(self, r: Req) -> bool:
        if not self.cache.shares_prefixes or r.admitted or len(r.prompt_ids) < self.ps:
            return False
        n = len(r.prompt_ids)
        return any(
            not q.prompt_cached and len(q.prompt_ids) == n and q.prompt_ids == r.prompt_ids
            for q in self.running
        )

    def _fit(self, r: Req, want: int, headroom: int) -> int:
        """How many of `want` tokens of r can get pages now, leaving `headroom` pages for running decodes."""
        avail = self.cache.available_pages - headroom
        if self._pages_needed(r, want) <= avail:
            return want
        room = (len(r.pages) + max(avail, 0)) * self.ps - r.kv_len
        return max(0, min(want, room))

    def finish(self, r: Req) -> None:
        self.running.remove(r)
        self.cache.release(r)
