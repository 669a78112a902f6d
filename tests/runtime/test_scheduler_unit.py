"""The scheduler's policy on its own, over a real cache manager and no model: queue order, the chunked-prefill
token budget, decode before prefill, admission headroom, retraction when pages run out, starved requests.

`step` plays the engine's part after a forward pass: the KV of every scheduled token is now in the pool, a
sequence whose chunk reached its end gets one (fixed) token, and a request at max_tokens finishes."""

from __future__ import annotations

import itertools

from skiff.config import EngineConfig
from skiff.kvcache.manager import CACHE_MANAGERS
from skiff.params import SamplingParams
from skiff.scheduler.request import Req
from skiff.scheduler.scheduler import ScheduleBatch, Scheduler

TOKEN = 7
_arrivals = itertools.count()


def scheduler(
    num_pages: int = 64, page_size: int = 4, budget: int = 16, max_running: int = 256, **cfg
) -> Scheduler:
    """num_pages counts the reserved page 0: the pool holds num_pages - 1. No prefix sharing unless
    cache="radix" is asked for (the prompts here overlap)."""
    cfg.setdefault("cache", "naive")
    config = EngineConfig(
        page_size=page_size, chunked_prefill_size=budget, max_running_requests=max_running, **cfg
    )
    return Scheduler(config, CACHE_MANAGERS[config.cache](num_pages, page_size))


def request(prompt_len: int, max_tokens: int = 8, priority: int = 0, first_token: int = 100) -> Req:
    arrival = next(_arrivals)
    prompt = list(range(first_token, first_token + prompt_len))
    return Req(f"r{arrival}", prompt, SamplingParams(max_tokens=max_tokens, priority=priority), arrival)


def step(s: Scheduler) -> ScheduleBatch | None:
    batch = s.schedule()
    for seq in batch.seqs if batch else []:
        seq.req.kv_len = seq.start + seq.q_len
        if not seq.req.prompt_cached and seq.req.kv_len >= len(seq.req.prompt_ids):
            seq.req.prompt_cached = True
            s.cache.cache_prompt(seq.req)
    for seq in batch.seqs if batch else []:
        if seq.samples:
            seq.req.output_ids.append(TOKEN)
            if len(seq.req.output_ids) >= seq.req.params.max_tokens:
                s.finish(seq.req)
    s.cache.check(s.running + s.waiting)
    return batch


def shape(batch: ScheduleBatch | None) -> list[tuple[Req, int, int]]:
    return [(seq.req, seq.start, seq.q_len) for seq in batch.seqs] if batch else []


def test_fcfs_admits_in_arrival_order_up_to_max_running() -> None:
    s = scheduler(max_running=2)
    a, b, c = request(4), request(4), request(4)
    for r in (c, a, b):
        s.enqueue(r)
    assert s.waiting == [a, b, c]
    assert shape(step(s)) == [(a, 0, 4), (b, 0, 4)]
    assert s.waiting == [c]


def test_priority_policy_orders_by_priority_then_arrival() -> None:
    s = scheduler(schedule_policy="priority")
    low, high, high_later = request(4), request(4, priority=5), request(4, priority=5)
    for r in (low, high_later, high):
        s.enqueue(r)
    assert s.waiting == [high, high_later, low]
    fcfs = scheduler()
    for r in (low, high_later, high):
        fcfs.enqueue(r)
    assert fcfs.waiting == [low, high, high_later]  # priorities are ignored under fcfs


def test_a_long_prompt_is_prefilled_in_budget_sized_chunks() -> None:
    s = scheduler(budget=16)
    r = request(40)
    s.enqueue(r)
    chunks, sampled = [], []
    for _ in range(4):
        chunks.append(step(s))
        sampled.append(len(r.output_ids))
    assert [shape(b) for b in chunks] == [[(r, 0, 16)], [(r, 16, 16)], [(r, 32, 8)], [(r, 40, 1)]]
    assert sampled == [0, 0, 1, 2]  # a token only once the whole prompt is in
    assert [b.num_decode for b in chunks] == [0, 0, 0, 1]


def test_decodes_come_first_and_prefill_gets_the_rest_of_the_budget() -> None:
    s = scheduler(budget=16)
    decoding = request(8)
    s.enqueue(decoding)
    step(s)
    newcomer = request(40)
    s.enqueue(newcomer)
    batch = step(s)
    assert shape(batch) == [(decoding, 8, 1), (newcomer, 0, 15)]
    assert batch is not None and batch.num_decode == 1


def test_a_newcomer_is_not_admitted_for_a_sliver_while_others_run() -> None:
    s = scheduler(num_pages=4, page_size=4, budget=16)  # 3 pages
    running, newcomer = request(4), request(8)
    s.enqueue(running)
    s.enqueue(newcomer)
    # one page is kept for `running`'s next decode: the newcomer could have 1 page (4 of 8 tokens) only
    assert shape(step(s)) == [(running, 0, 4)]
    assert s.waiting == [newcomer] and newcomer.pages == []


def test_decode_out_of_pages_retracts_the_newest_which_resumes_later() -> None:
    s = scheduler(num_pages=4, page_size=4)  # 3 pages
    old, new = request(4, max_tokens=2), request(4, max_tokens=2)
    s.enqueue(old)
    s.enqueue(new)
    assert shape(step(s)) == [(old, 0, 4), (new, 0, 4)]  # one page each; both now need a second
    assert shape(step(s)) == [(old, 4, 1)]
    assert s.num_retractions == 1 and new.num_retractions == 1
    assert s.waiting == [new] and new.pages == [] and new.kv_len == 0
    assert new.output_ids == [TOKEN]  # kept: the retry recomputes prompt + output
    assert old not in s.running  # finished at max_tokens, its pages freed
    assert shape(step(s)) == [(new, 0, 5)]
    assert new.output_ids == [TOKEN, TOKEN]


def test_when_every_running_request_is_stuck_mid_prefill_the_newest_is_retracted() -> None:
    s = scheduler(num_pages=5, page_size=4)  # 4 pages, two held by each request
    old, new = request(24), request(24)
    for r in (old, new):
        r.admitted, r.pages, r.kv_len = True, s.cache.alloc(2), 8
        s.running.append(r)
    assert shape(s.schedule()) == [(old, 8, 8)]
    assert s.waiting == [new] and new.kv_len == 0 and s.num_retractions == 1


def test_a_lone_request_that_outgrows_the_pool_is_starved() -> None:
    s = scheduler(num_pages=3, page_size=4)  # 2 pages: 8 tokens
    r = request(8, max_tokens=10)
    s.enqueue(r)
    step(s)
    assert s.schedule() is None
    assert s.starved == [r]  # the engine ends it ("length")
    assert s.num_retractions == 0


def test_a_prompt_larger_than_the_pool_is_starved_not_looped() -> None:
    s = scheduler(num_pages=5, page_size=4)  # 4 pages: 16 tokens
    r = request(20)
    s.enqueue(r)
    assert shape(step(s)) == [(r, 0, 16)]
    assert s.schedule() is None and s.starved == [r]


def test_a_cached_prefix_is_skipped_by_the_next_request() -> None:
    s = scheduler(cache="radix")
    first = request(12, max_tokens=1)
    s.enqueue(first)
    step(s)  # done: its three pages stay in the radix tree
    again = request(12, max_tokens=1)
    s.enqueue(again)
    assert shape(step(s)) == [(again, 8, 4)]  # the last page is recomputed: it holds the token to sample from
    assert again.cached_tokens == 8


def test_remove_frees_a_running_request_and_finds_queued_ones() -> None:
    s = scheduler(max_running=1)
    running, queued = request(8), request(8)
    s.enqueue(running)
    s.enqueue(queued)
    step(s)
    free = s.cache.available_pages
    assert s.remove(running.rid) is running and s.cache.available_pages == free + 2
    assert s.remove(queued.rid) is queued
    assert s.remove("nobody") is None
    assert not s.running and not s.waiting
