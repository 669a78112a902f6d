"""Radix-tree prefix cache keyed by token ids, one page of tokens per edge step.

Invariants: every node's key is a whole number of pages and `pages[i]` holds the KV of key[i*ps:(i+1)*ps];
a node's lock_ref counts the live requests whose prefix passes through it (a lock is taken on the whole
path), so a node with lock_ref == 0 has no locked descendant and may be evicted once it is a leaf.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field


@dataclass(eq=False)
class RadixNode:
    key: tuple[int, ...] = ()
    pages: list[int] = field(default_factory=list)
    parent: RadixNode | None = None
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0


class RadixCache:
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.root = RadixNode(lock_ref=1)  # the root is never evicted
        self._clock = itertools.count(1)
        self.num_cached_pages = 0
        self.num_locked_pages = 0

    @property
    def num_evictable_pages(self) -> int:
        return self.num_cached_pages - self.num_locked_pages

    def _first(self, tokens: tuple[int, ...] | list[int], at: int) -> tuple[int, ...]:
        return tuple(tokens[at : at + self.page_size])

    def _split(self, node: RadixNode, pages: int) -> RadixNode:
        """Cut `node` after `pages` pages; returns the new upper part (which keeps the lock count)."""
        cut = pages * self.page_size
        upper = RadixNode(
            node.key[:cut], node.pages[:pages], node.parent, {}, node.lock_ref, node.last_access
        )
        assert node.parent is not None
        node.parent.children[self._first(upper.key, 0)] = upper
        node.key, node.pages, node.parent = node.key[cut:], node.pages[pages:], upper
        upper.children[self._first(node.key, 0)] = node
        return upper

    def _common_pages(self, key: tuple[int, ...], tokens: list[int], at: int) -> int:
        ps, n = self.page_size, 0
        while (
            (n + 1) * ps <= len(key)
            and at + (n + 1) * ps <= len(tokens)
            and key[n * ps : (n + 1) * ps] == tuple(tokens[at + n * ps : at + (n + 1) * ps])
        ):
            n += 1
        return n

    def _walk(self, tokens: list[int]) -> tuple[RadixNode, list[int]]:
        """Longest cached prefix of `tokens` (whole pages): the deepest node on it and its pages."""
        node, at, pages, now = self.root, 0, [], next(self._clock)
        while at + self.page_size <= len(tokens):
            child = node.children.get(self._first(tokens, at))
            if child is None:
                break
            n = self._common_pages(child.key, tokens, at)
            if n * self.page_size < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            pages.extend(child.pages)
            at += len(child.key)
            node = child
        return node, pages

    def match(self, tokens: list[int]) -> tuple[list[int], RadixNode]:
        node, pages = self._walk(tokens)
        return pages, node

    def insert(self, tokens: list[int], pages: list[int]) -> tuple[list[int], RadixNode]:
        """Insert the whole pages of `tokens` (pages[i] holds page i). Returns the tree's pages for that
        prefix (pages already cached win over the caller's duplicates) and the deepest node."""
        full = len(pages) * self.page_size
        assert full <= len(tokens)
        node, cached = self._walk(tokens[:full])
        if len(cached) < len(pages):
            rest = tuple(tokens[len(cached) * self.page_size : full])
            leaf = RadixNode(rest, list(pages[len(cached) :]), node, {}, 0, next(self._clock))
            node.children[self._first(rest, 0)] = leaf
            self.num_cached_pages += len(leaf.pages)
            node, cached = leaf, cached + leaf.pages
        return cached, node

    def lock(self, node: RadixNode) -> None:
        while node is not self.root and node is not None:
            if node.lock_ref == 0:
                self.num_locked_pages += len(node.pages)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: RadixNode) -> None:
        while node is not self.root and node is not None:
            node.lock_ref -= 1
            assert node.lock_ref >= 0, "radix lock released twice"
            if node.lock_ref == 0:
                self.num_locked_pages -= len(node.pages)
            node = node.parent  # type: ignore[assignment]

    def evict(self, num_pages: int) -> list[int]:
        """Free at least num_pages pages (if that many are evictable), least recently used leaves first."""
        heap = [(n.last_access, id(n), n) for n in self._nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        freed: list[int] = []
        while heap and len(freed) < num_pages:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            del parent.children[self._first(node.key, 0)]
            freed.extend(node.pages)
            self.num_cached_pages -= len(node.pages)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed

    def _nodes(self) -> list[RadixNode]:
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if n is not self.root:
                out.append(n)
        return out

    def check(self) -> None:
        nodes = self._nodes()
        assert sum(len(n.pages) for n in nodes) == self.num_cached_pages, "radix page count drifted"
        assert sum(len(n.pages) for n in nodes if n.lock_ref > 0) == self.num_locked_pages, (
            "radix lock count drifted"
        )
        for n in nodes:
            assert len(n.key) == len(n.pages) * self.page_size and n.pages, "radix node is not page aligned"
