"""Chunked prefill budgets and page sizes do not change greedy outputs."""

from __future__ import annotations

import pytest
from skiff import SamplingParams
from skiff_rt_helpers import assert_same_greedy, random_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    # lengths from 1 to ~450: single pages, exact page multiples and many chunks
    ps = random_prompts(5, seed=60, lo=1, hi=450)
    return ps + [random_prompts(1, seed=61, lo=n, hi=n)[0] for n in (1, 16, 256, 257)]


@pytest.fixture(scope="module")
def reference(tiny_llama_dir, llm_factory_module, prompts):
    llm = llm_factory_module(
        tiny_llama_dir, page_size=16, chunked_prefill_size=8192, cache="naive", max_total_tokens=16384
    )
    return llm, [o.token_ids for o in llm.generate(prompts, GREEDY)]


@pytest.mark.parametrize(
    ("page_size", "chunk", "cache"),
    [
        (16, 16, "radix"),
        (16, 17, "naive"),
        (16, 100, "radix"),
        (16, 512, "radix"),
        (1, 8192, "radix"),
        (1, 37, "naive"),
        (256, 8192, "radix"),
        (256, 64, "radix"),
    ],
)
def test_same_output(tiny_llama_dir, llm_factory, prompts, reference, page_size, chunk, cache):
    ref_llm, ref = reference
    llm = llm_factory(
        tiny_llama_dir, page_size=page_size, chunked_prefill_size=chunk, cache=cache, max_total_tokens=16384
    )
    got = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    assert_same_greedy(prompts, got, ref, ref_llm.prefill_logits, f"page {page_size}, chunk {chunk}, {cache}")
    if cache == "radix":  # second pass: now mostly cache hits, still the same tokens
        again = llm.generate(prompts, GREEDY)
        assert sum(o.cached_tokens for o in again) > 0
        assert_same_greedy(prompts, [o.token_ids for o in again], ref, ref_llm.prefill_logits, "cached pass")
