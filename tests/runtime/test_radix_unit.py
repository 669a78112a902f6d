"""The radix prefix cache on its own (and through its cache manager): prefix match by whole pages, insert,
LRU eviction of unlocked leaves, lock counts; no model."""

from __future__ import annotations

import pytest
from skiff.kvcache.manager import RadixCacheManager
from skiff.kvcache.radix import RadixCache
from skiff.params import SamplingParams
from skiff.scheduler.request import Req


def test_match_returns_the_pages_of_the_longest_cached_prefix() -> None:
    tree = RadixCache(page_size=1)
    tree.insert([1, 2, 3], [11, 12, 13])
    assert tree.match([1, 2, 3, 4])[0] == [11, 12, 13]
    assert tree.match([1, 2, 9])[0] == [11, 12]  # splits the node after its first two pages
    assert tree.match([5, 1])[0] == []
    assert tree.num_cached_pages == 3
    tree.check()


def test_only_whole_pages_match() -> None:
    tree = RadixCache(page_size=4)
    tree.insert(list(range(10)), [7, 8])  # 10 tokens: two whole pages, the last two tokens are not cached
    assert tree.match(list(range(10)))[0] == [7, 8]
    assert tree.match(list(range(7)))[0] == [7]  # 7 tokens: one whole page
    assert tree.match(list(range(3)))[0] == []
    assert tree.match([0, 1, 2, 99, 4, 5, 6, 7])[0] == []  # a difference inside the first page
    tree.check()  # every node's key is a whole number of pages, also after the split above


def test_insert_keeps_the_first_pages_for_a_prefix() -> None:
    tree = RadixCache(page_size=2)
    canonical, _ = tree.insert([1, 2, 3, 4], [5, 6])
    again, _ = tree.insert([1, 2, 3, 4, 7, 8], [50, 60, 70])  # another request computed the same prefix
    assert canonical == [5, 6] and again == [5, 6, 70]
    assert tree.num_cached_pages == 3


def test_eviction_takes_the_least_recently_used_leaf_first() -> None:
    tree = RadixCache(page_size=1)
    for first in (1, 2, 3):
        tree.insert([first, first], [first * 10, first * 10 + 1])
    tree.match([1, 1])  # 1 is used again: 2 is now the least recently used
    assert tree.evict(1) == [20, 21]  # a whole node goes, so "at least" one page
    assert tree.evict(2) == [30, 31]
    assert tree.evict(2) == [10, 11]
    assert tree.num_cached_pages == 0 and tree.evict(1) == []


def test_a_parent_goes_after_its_children() -> None:
    tree = RadixCache(page_size=1)
    tree.insert([1, 2], [1, 2])
    tree.insert([1, 2, 3, 4], [1, 2, 3, 4])
    assert tree.evict(4) == [3, 4, 1, 2]


def test_locked_paths_are_not_evicted_until_unlocked() -> None:
    tree = RadixCache(page_size=1)
    _, shared = tree.insert([1, 2], [1, 2])
    _, longer = tree.insert([1, 2, 3], [1, 2, 3])
    tree.insert([9], [9])
    tree.lock(longer)  # a live request on [1, 2, 3] pins the whole path
    tree.lock(shared)  # and a second one on [1, 2]
    assert tree.num_evictable_pages == 1
    assert tree.evict(10) == [9]
    tree.unlock(longer)
    assert tree.num_evictable_pages == 1 and tree.evict(10) == [3]  # [1, 2] is still locked
    tree.unlock(shared)
    assert tree.evict(10) == [1, 2]
    tree.check()


def test_a_lock_released_twice_is_caught() -> None:
    tree = RadixCache(page_size=1)
    _, node = tree.insert([1], [1])
    tree.lock(node)
    tree.unlock(node)
    with pytest.raises(AssertionError, match="released twice"):
        tree.unlock(node)


def _req(prompt: list[int]) -> Req:
    return Req("r", prompt, SamplingParams(max_tokens=4), arrival=0)


def test_a_released_request_leaves_its_whole_pages_for_the_next_one() -> None:
    cache = RadixCacheManager(num_pages=9, page_size=4)
    first = _req(list(range(10)))
    first.pages = cache.alloc(3)
    first.kv_len = 10  # its prompt's KV computed: two whole pages and two tokens
    cache.release(first)
    assert cache.num_cached_pages == 2 and cache.allocator.num_free == 6 and first.pages == []
    second = _req([*range(8), 50, 51])
    cache.match(second)
    assert (second.cached_pages, second.kv_len) == (2, 8)
    assert cache.num_evictable_pages == 0  # locked while the second request lives
    cache.check([second])
    cache.release(second)
    cache.check([])


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    cache = RadixCacheManager(num_pages=9, page_size=1)
    prompt = [3, 1, 4, 1, 5]
    cached = _req(prompt)
    cached.pages, cached.kv_len = cache.alloc(5), 5
    cache.release(cached)
    again = _req(prompt)
    cache.match(again)
    assert again.kv_len == 4 and again.remaining == 1  # the logits of the last token need computing
    cache.release(again)


def test_alloc_evicts_cached_pages_when_the_free_list_is_short() -> None:
    cache = RadixCacheManager(num_pages=5, page_size=1)
    pages = cache.alloc(4)
    assert pages is not None
    cache.tree.insert([1, 2, 3, 4], pages)
    assert cache.allocator.num_free == 0 and cache.available_pages == 4
    got = cache.alloc(3)
    assert got is not None and len(got) == 3 and set(got) <= set(pages)
    assert cache.num_cached_pages == 0  # the one node goes whole; the page left over is free
    assert cache.allocator.num_free == 1
    assert cache.alloc(2) is None
