"""Cache managers: how a request gets, shares and gives back KV pages.

A request's page table is `req.pages`; its first `req.cached_pages` pages belong to the prefix cache (and are
locked through `req.node` while the request lives), the rest are private to it. Integrity:
free pages + cached pages + private pages of live requests == total pages.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from skiff.kvcache.pool import PageAllocator
from skiff.kvcache.radix import RadixCache

if TYPE_CHECKING:
    from skiff.scheduler.request import Req


class NaiveCacheManager:
    """No sharing: every request computes its whole context and frees every page when it leaves."""

    shares_prefixes = False  # whether a prompt's cached pages serve later requests

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.allocator = PageAllocator(num_pages)
        self.page_size = page_size

    @property
    def total_pages(self) -> int:
        return self.allocator.total

    @property
    def num_cached_pages(self) -> int:
        return 0

    @property
    def num_evictable_pages(self) -> int:
        return 0

    @property
    def available_pages(self) -> int:
        return self.allocator.num_free + self.num_evictable_pages

    def alloc(self, n: int) -> list[int] | None:
        if n > self.allocator.num_free:
            self._evict(n - self.allocator.num_free)
        return self.allocator.alloc(n)

    def _evict(self, n: int) -> None:
        pass

    def match(self, req: Req) -> None:
        """Attach the longest cached prefix of the request's tokens (at least one token left to compute)."""

    def cache_prompt(self, req: Req) -> None:
        """Called once the prompt's KV is complete: share its whole pages with later requests."""

    def release(self, req: Req) -> None:
        """The request leaves (finished, aborted or retracted): free its private pages."""
        self.allocator.free(req.pages[req.cached_pages :])
        req.pages, req.cached_pages, req.node, req.kv_len = [], 0, None, 0

    def check(self, live: Iterable[Req]) -> None:
        private = sum(len(r.pages) - r.cached_pages for r in live)
        total = self.allocator.num_free + self.num_cached_pages + private
        assert total == self.total_pages, (
            f"KV page leak: free {self.allocator.num_free} + cached {self.num_cached_pages} + in use {private}"
            f" = {total} != total {self.total_pages}"
        )
        assert len(set(self.allocator._free)) == self.allocator.num_free, "a page was freed twice"


class RadixCacheManager(NaiveCacheManager):
    shares_prefixes = True

    def __init__(self, num_pages: int, page_size: int) -> None:
        super().__init__(num_pages, page_size)
        self.tree = RadixCache(page_size)

    @property
    def num_cached_pages(self) -> int:
        return self.tree.num_cached_pages

    @property
    def num_evictable_pages(self) -> int:
        return self.tree.num_evictable_pages

    def _evict(self, n: int) -> None:
        self.allocator.free(self.tree.evict(n))

    def match(self, req: Req) -> None:
        tokens = req.all_ids
        pages, node = self.tree.match(tokens[: len(tokens) - 1])
        self.tree.lock(node)
        req.pages, req.cached_pages, req.node = list(pages), len(pages), node
        req.kv_len = len(pages) * self.page_size

    def _insert(self, req: Req, num_tokens: int) -> None:
        full = num_tokens // self.page_size
        if full <= req.cached_pages:
            return
        canonical, node = self.tree.insert(req.all_ids[: full * self.page_size], req.pages[:full])
        duplicates = [mine for mine, tree in zip(req.pages[:full], canonical, strict=True) if mine != tree]
        self.allocator.free(duplicates)  # another request cached the same tokens first: use its pages
        req.pages[:full] = canonical
        self.tree.lock(node)
        if req.node is not None:
            self.tree.unlock(req.node)
        req.node, req.cached_pages = node, full

    def cache_prompt(self, req: Req) -> None:
        self._insert(req, min(req.kv_len, len(req.prompt_ids)))

    def release(self, req: Req) -> None:
        self._insert(req, req.kv_len)
        if req.node is not None:
            self.tree.unlock(req.node)
        super().release(req)

    def check(self, live: Iterable[Req]) -> None:
        self.tree.check()
        super().check(live)


CACHE_MANAGERS: dict[str, type[NaiveCacheManager]] = {"naive": NaiveCacheManager, "radix": RadixCacheManager}
