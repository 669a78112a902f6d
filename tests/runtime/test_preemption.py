"""A KV pool too small for all requests at once: requests are retracted and still finish identically."""

from __future__ import annotations

import pytest
from skiff import SamplingParams
from skiff_rt_helpers import assert_same_greedy, random_prompts

PARAMS = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return random_prompts(8, seed=70, lo=20, hi=60)


@pytest.fixture(scope="module")
def reference(tiny_llama_dir, llm_factory_module, prompts):
    llm = llm_factory_module(tiny_llama_dir, page_size=16, max_total_tokens=16384)
    outs = llm.generate(prompts, PARAMS)
    assert llm.engine.stats().num_preemptions == 0
    return llm, [o.token_ids for o in outs]


@pytest.mark.parametrize(
    ("cache", "page_size", "pages"), [("radix", 16, 8), ("naive", 16, 8), ("radix", 1, 110)]
)
def test_preempted_requests_finish_identically(
    tiny_llama_dir, llm_factory, prompts, reference, cache, page_size, pages
):
    ref_llm, ref = reference
    llm = llm_factory(tiny_llama_dir, cache=cache, page_size=page_size, max_total_tokens=pages * page_size)
    st = llm.engine.stats()
    need = sum(len(p) + PARAMS.max_tokens for p in prompts)
    assert need > 2 * st.total_pages * page_size, "the pool must be too small for all requests at once"
    assert max(len(p) for p in prompts) + PARAMS.max_tokens <= st.total_pages * page_size
    outs = llm.generate(prompts, PARAMS)
    assert all(o.finish_reason == "length" and len(o.token_ids) == PARAMS.max_tokens for o in outs)
    assert llm.engine.stats().num_preemptions > 0
    assert_same_greedy(
        prompts, [o.token_ids for o in outs], ref, ref_llm.prefill_logits, f"preempted {cache}"
    )
    st = llm.engine.stats()
    llm.engine.check_integrity()
    assert st.used_pages == 0 and st.free_pages + st.cached_pages == st.total_pages
