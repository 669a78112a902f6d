"""Balancers: prefix stickiness, bounded load, ring stability, least requests, round robin; routing keys."""

from __future__ import annotations

import collections

import pytest
from skiff_router.balance import Endpoint, LeastRequests, PrefixHash, RoundRobin, make_balancer, prefix_key


def endpoints(n: int) -> list[Endpoint]:
    return [Endpoint(f"10.0.0.{i}:8000") for i in range(n)]


def test_same_prefix_sticks_to_one_endpoint_and_prefixes_spread():
    eps, b = endpoints(3), PrefixHash()
    picks = {b.pick(eps, "system prompt A", set()).address for _ in range(20)}
    assert len(picks) == 1
    spread = collections.Counter(b.pick(eps, f"prefix {i}", set()).address for i in range(600))
    assert len(spread) == 3 and min(spread.values()) > 100  # roughly even over distinct prefixes


def test_bounded_load_spills_a_hot_prefix_to_a_stable_second_choice():
    eps, b = endpoints(3), PrefixHash(load_factor=1.25)
    home = b.pick(eps, "hot", set())
    placed = []
    for _ in range(9):  # nine concurrent requests of one prefix, none finishing
        e = b.pick(eps, "hot", set())
        e.inflight += 1
        placed.append(e.address)
    counts = collections.Counter(placed)
    assert counts[home.address] == max(counts.values())
    assert max(counts.values()) <= 4  # ceil(1.25 * 9 / 3) = 4: no endpoint over its bounded share
    for e in eps:
        e.inflight = 0
    assert b.pick(eps, "hot", set()) is home  # load gone: back home


def test_ring_moves_few_keys_when_an_endpoint_is_added():
    b = PrefixHash()
    eps3 = endpoints(3)
    before = {k: b.pick(eps3, f"k{k}", set()).address for k in range(500)}
    eps4 = eps3 + [Endpoint("10.0.0.9:8000")]
    after = {k: b.pick(eps4, f"k{k}", set()).address for k in range(500)}
    moved = [k for k in before if before[k] != after[k]]
    assert all(after[k] == "10.0.0.9:8000" for k in moved)  # keys only move to the new endpoint
    assert 60 < len(moved) < 200  # about a quarter


def test_excluded_endpoints_are_skipped_by_every_strategy():
    eps = endpoints(3)
    for b in (PrefixHash(), LeastRequests(), RoundRobin()):
        home = b.pick(eps, "x", set())
        other = b.pick(eps, "x", {home.address})
        assert other is not None and other is not home
        assert b.pick(eps, "x", {e.address for e in eps}) is None


def test_least_requests_and_round_robin():
    eps = endpoints(3)
    eps[0].inflight, eps[1].inflight, eps[2].inflight = 3, 1, 2
    assert LeastRequests().pick(eps, "", set()) is eps[1]
    rr = RoundRobin()
    assert [rr.pick(eps, "", set()).address for _ in range(6)] == [e.address for e in eps] * 2


def test_empty_key_falls_back_to_least_requests():
    eps = endpoints(2)
    eps[0].inflight = 5
    assert PrefixHash().pick(eps, "", set()) is eps[1]


def test_prefix_key_of_completions_and_chat():
    assert prefix_key({"prompt": "abcdef"}, 3) == "abc"
    assert prefix_key({"prompt": ["first", "second"]}, 10) == "first"
    assert prefix_key({"prompt": [1, 2, 3]}, 10) == "1,2,3"
    chat = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ]
    }
    assert prefix_key(chat, 100) == "system:be brief\nuser:hi\n"
    assert prefix_key(chat, 6) == "system"


def test_unknown_strategy_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown routing strategy 'fastest'"):
        make_balancer("fastest")
