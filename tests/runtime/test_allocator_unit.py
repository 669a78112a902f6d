"""The page allocator on its own: a free list of page ids, page 0 reserved for padding; no model, no KV pool."""

from __future__ import annotations

import pytest
from skiff.kvcache.manager import NaiveCacheManager
from skiff.kvcache.pool import PageAllocator


def test_every_page_but_page_zero_is_handed_out_once() -> None:
    alloc = PageAllocator(9)
    assert alloc.total == alloc.num_free == 8
    pages = alloc.alloc(3) + alloc.alloc(5)
    assert sorted(pages) == list(range(1, 9))  # page 0: where padded slots of a batch point
    assert alloc.num_free == 0


def test_out_of_pages_returns_none_and_takes_nothing() -> None:
    alloc = PageAllocator(5)
    first = alloc.alloc(3)
    assert first is not None and alloc.alloc(2) is None
    assert alloc.num_free == 1
    assert alloc.alloc(1) is not None and alloc.alloc(1) is None
    assert alloc.alloc(0) == []


def test_freed_pages_come_back() -> None:
    alloc = PageAllocator(4)
    pages = alloc.alloc(3)
    assert pages is not None
    alloc.free(pages[:2])
    assert alloc.num_free == 2
    again = alloc.alloc(2)
    assert again is not None and sorted(again) == sorted(pages[:2])


def test_a_double_free_is_caught_by_the_integrity_check() -> None:
    """The allocator trusts its callers; the cache manager's check (run by the engine) finds a page freed twice."""
    cache = NaiveCacheManager(num_pages=6, page_size=4)
    pages = cache.alloc(2)
    assert pages is not None
    cache.allocator.free([pages[0], pages[0]])  # page counts add up again, one page is listed twice
    with pytest.raises(AssertionError, match="freed twice"):
        cache.check([])


def test_a_leaked_page_is_caught_by_the_integrity_check() -> None:
    cache = NaiveCacheManager(num_pages=6, page_size=4)
    assert cache.alloc(1) is not None  # held by no live request
    with pytest.raises(AssertionError, match="KV page leak"):
        cache.check([])
