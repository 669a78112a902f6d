"""bf16 on CPU: the torch path rounds where HF transformers rounds, so its logits are HF's, bit for bit.

Prefill runs the same ops in the same order as HF (rope included: its table and each product and sum
rounded to bf16), so the logits are compared with torch.equal. Decode reads the cache through Skiff's own
attention kernel, whose fp32 sums run in another order than HF's full-sequence SDPA; there the greedy
tokens must be HF's argmax (counting exact ties of HF's bf16 logits) at nearly every position.
"""

from __future__ import annotations

import pytest
import torch
from skiff import SamplingParams
from skiff_rt_helpers import hf_logits_fn, random_prompts, teacher_forced_divergences
from support.random_models import RANDOM_MODELS

MODELS = [n for n in RANDOM_MODELS if n != "tiny_llama"]


@pytest.fixture(scope="module", params=MODELS)
def pair(request, random_model, llm_factory_module):
    from transformers import AutoModelForCausalLM

    path = random_model(request.param)
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16).eval()
    return request.param, hf, llm_factory_module(path, dtype="bfloat16", max_total_tokens=8192)


def test_prefill_logits_bit_equal_to_hf(pair):
    name, hf, llm = pair
    for p in random_prompts(
        3, seed=2, lo=100, hi=600
    ):  # past the rope-scaled configs' original context (256)
        ours = llm.prefill_logits(p)
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0].float()
        rows = (ours == ref).all(-1)
        assert bool(rows.all()), (
            f"{name}: {int((~rows).sum())}/{len(p)} rows differ from HF bf16, "
            f"max |diff| {(ours - ref).abs().max().item():.3g}"
        )


def test_greedy_decode_follows_hf(pair):
    name, hf, llm = pair
    prompts = random_prompts(12, seed=1, lo=3, hi=150)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True))
    got = [o.token_ids for o in outs]
    divs = teacher_forced_divergences(prompts, got, hf_logits_fn(hf))
    off = [d for d in divs if d.gap > 0]  # HF's logit for Skiff's token is below its max
    positions = sum(len(g) for g in got)
    assert len(off) <= 0.02 * positions, (
        f"{name}: {len(off)}/{positions} tokens are not HF's bf16 argmax:\n" + "\n".join(map(str, off[:10]))
    )
