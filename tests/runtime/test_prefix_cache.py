"""Radix prefix cache: hits on shared prefixes, identical outputs with the cache on, off and under eviction."""

from __future__ import annotations

import pytest
from skiff import SamplingParams
from skiff_rt_helpers import assert_same_greedy, random_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
PAGE = 16


@pytest.fixture(scope="module")
def system_prompt() -> list[int]:
    return random_prompts(1, seed=10, lo=100, hi=100)[0]


@pytest.fixture(scope="module")
def naive(tiny_llama_dir, llm_factory_module):
    return llm_factory_module(tiny_llama_dir, cache="naive", page_size=PAGE, max_total_tokens=8192)


@pytest.fixture(scope="module")
def radix(tiny_llama_dir, llm_factory_module):
    return llm_factory_module(tiny_llama_dir, cache="radix", page_size=PAGE, max_total_tokens=8192)


def test_shared_system_prompt_hits_cache(radix, naive, system_prompt):
    prompts = random_prompts(6, seed=11, lo=5, hi=40, prefix=system_prompt)
    before = radix.engine.stats().cache_hit_tokens
    first = radix.generate(prompts[:1], GREEDY)
    assert first[0].cached_tokens == 0
    rest = radix.generate(prompts[1:], GREEDY)
    full_pages = len(system_prompt) // PAGE * PAGE
    for o in rest:
        assert full_pages <= o.cached_tokens < len(o.prompt_token_ids), o.cached_tokens
    hits = radix.engine.stats().cache_hit_tokens - before
    assert hits == sum(o.cached_tokens for o in rest)
    ref = naive.generate(prompts, GREEDY)
    assert all(o.cached_tokens == 0 for o in ref)
    got = [o.token_ids for o in first + rest]
    assert_same_greedy(prompts, got, [o.token_ids for o in ref], naive.prefill_logits, "radix vs naive")


def test_prefix_shared_while_first_request_still_runs(radix, system_prompt):
    """The prompt is inserted when its prefill finishes, so a request arriving mid-decode shares it."""
    eng = radix.engine
    a, b = random_prompts(2, seed=12, lo=10, hi=20, prefix=system_prompt[:80] + [7777])
    eng.add_request("share-a", a, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    produced = 0
    while produced < 2:
        produced += sum(len(o.token_ids) for o in eng.step() if o.rid == "share-a")
    eng.add_request("share-b", b, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    seen: dict[str, list] = {"share-a": [], "share-b": []}
    b_cached = None
    a_running_when_b_done = False
    while eng.has_work:
        for o in eng.step():
            seen[o.rid].append(o)
            if o.rid == "share-b" and o.finished:
                b_cached = o.cached_tokens
                a_running_when_b_done = not any(x.finished for x in seen["share-a"])
    assert b_cached is not None and b_cached >= 80 // PAGE * PAGE, b_cached
    assert a_running_when_b_done


def test_many_rounds_identical_with_cache_on_and_off(radix, naive):
    prefixes = [random_prompts(1, seed=20 + k, lo=40, hi=90)[0] for k in range(3)]
    prompts = [p for k in range(3) for p in random_prompts(4, seed=30 + k, lo=1, hi=30, prefix=prefixes[k])]
    for rnd in range(2):
        got = radix.generate(prompts, GREEDY)
        ref = naive.generate(prompts, GREEDY)
        assert_same_greedy(
            prompts,
            [o.token_ids for o in got],
            [o.token_ids for o in ref],
            naive.prefill_logits,
            f"round {rnd}",
        )
        if rnd == 1:  # everything was seen in round 0
            assert all(o.cached_tokens >= len(o.prompt_token_ids) // PAGE * PAGE - PAGE for o in got)
    assert naive.engine.stats().cache_hit_tokens == 0


def test_eviction_pressure(tiny_llama_dir, llm_factory, naive):
    """A pool of 32 pages that the stream of distinct prompts overflows many times over."""
    llm = llm_factory(tiny_llama_dir, cache="radix", page_size=PAGE, max_total_tokens=32 * PAGE)
    capacity = llm.engine.stats().total_pages * PAGE
    prefixes = [random_prompts(1, seed=40 + k, lo=100, hi=150)[0] for k in range(6)]
    all_prompts, got = [], []
    for k, pre in enumerate(prefixes):
        prompts = random_prompts(2, seed=50 + k, lo=1, hi=30, prefix=pre)
        outs = llm.generate(prompts[:1], GREEDY) + llm.generate(prompts[1:], GREEDY)
        st = llm.engine.stats()
        assert st.cached_pages <= st.total_pages
        llm.engine.check_integrity()
        all_prompts += prompts
        got += [o.token_ids for o in outs]
        assert outs[1].cached_tokens >= len(pre) // PAGE * PAGE  # the second shares the first's prefix
    assert sum(len(p) for p in all_prompts) > 2 * capacity
    # LRU: the oldest prefix was evicted, the newest is still there
    oldest, newest = llm.generate([all_prompts[0], all_prompts[-1]], GREEDY)
    assert oldest.cached_tokens < len(prefixes[0]) // PAGE * PAGE
    assert newest.cached_tokens >= len(prefixes[-1]) // PAGE * PAGE
    got += [oldest.token_ids, newest.token_ids]
    all_prompts += [all_prompts[0], all_prompts[-1]]
    ref = naive.generate(all_prompts, GREEDY)
    assert_same_greedy(all_prompts, got, [o.token_ids for o in ref], naive.prefill_logits, "under eviction")


def test_identical_prompts_submitted_together_prefill_once(radix, naive):
    """n > 1 choices arrive as twins in one step: the later ones wait for the first one's pages."""
    prompt = random_prompts(1, seed=21, lo=70, hi=70)[0]
    sampled = [SamplingParams(temperature=0.8, seed=s, max_tokens=8) for s in range(4)]
    outs = radix.generate([prompt] * 4, sampled)
    full_pages = len(prompt) // PAGE * PAGE
    assert outs[0].cached_tokens < full_pages  # (earlier tests may have cached a shorter prefix)
    assert all(o.cached_tokens == full_pages for o in outs[1:]), [o.cached_tokens for o in outs]
    ref = naive.generate([prompt] * 4, sampled)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
