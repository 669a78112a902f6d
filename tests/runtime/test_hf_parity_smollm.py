"""Skiff vs HF transformers on the real embedded SmolLM2-135M-Instruct (GGUF, dequantized to fp32)."""

from __future__ import annotations

import pytest
import torch
from skiff import SamplingParams
from skiff_rt_helpers import (
    CHAT_QUESTIONS,
    assert_divergences_acceptable,
    chat_prompt_ids,
    hf_greedy,
    hf_logits_fn,
    teacher_forced_divergences,
)

NEW_TOKENS = 64


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    ids = chat_prompt_ids(tokenizer)
    assert len(ids) >= 20 and len({len(p) for p in ids}) > 10  # mixed lengths
    return ids


@pytest.fixture(scope="module")
def skiff_greedy(smollm, prompts):
    """All prompts in one generate call: one continuously batched run of mixed lengths."""
    outs = smollm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True))
    return [o.token_ids for o in outs]


def test_greedy_matches_hf_for_chat_prompts(hf_smollm, prompts, skiff_greedy):
    assert all(len(o) == NEW_TOKENS for o in skiff_greedy)
    # HF's logits along Skiff's own output: where Skiff picked HF's argmax at every position, HF's greedy
    # decoding reproduces Skiff's tokens exactly; elsewhere the near-tie rule decides.
    divs = teacher_forced_divergences(prompts, skiff_greedy, hf_logits_fn(hf_smollm))
    assert_divergences_acceptable(divs, len(prompts), "SmolLM2 greedy vs HF")


def test_greedy_matches_hf_generate(hf_smollm, prompts, skiff_greedy):
    """HF's own generate() on a few prompts (it is slow on 2 cores), compared token for token."""
    for i in (0, 3):
        ref = hf_greedy(hf_smollm, prompts[i], NEW_TOKENS)
        if ref != skiff_greedy[i]:
            divs = teacher_forced_divergences([prompts[i]], [skiff_greedy[i]], hf_logits_fn(hf_smollm))
            assert divs and all(d.near_tie for d in divs), f"prompt {i}: HF {ref} vs Skiff {skiff_greedy[i]}"


def test_capital_of_france(smollm, tokenizer):
    ids = chat_prompt_ids(tokenizer, [CHAT_QUESTIONS[0]])
    out = smollm.generate(ids, SamplingParams(temperature=0.0, max_tokens=32))[0]
    assert out.text.strip() == "The capital of France is Paris."
    assert out.finish_reason == "stop"


def test_text_prompt_equals_token_prompt(smollm, tokenizer):
    text = "The three largest cities of Germany are"
    ids = list(tokenizer.encode(text, add_special_tokens=True))
    p = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    a, b = smollm.generate([text, ids], p)
    assert a.prompt_token_ids == ids
    assert a.token_ids == b.token_ids
    assert a.text == tokenizer.decode(a.token_ids, skip_special_tokens=True)


def test_prefill_logits_close_to_hf(smollm, hf_smollm, prompts):
    for p in (prompts[1], prompts[16]):
        ours = smollm.prefill_logits(p)
        with torch.no_grad():
            ref = hf_smollm(torch.tensor([p])).logits[0].float()
        assert ours.shape == ref.shape and ours.dtype == torch.float32
        err = (ours - ref).abs().max().item()
        assert err < 2e-3 * max(1.0, ref.abs().max().item()), f"max |logit diff| {err}"
        assert torch.equal(ours.argmax(-1), ref.argmax(-1)) or err < 1e-3
