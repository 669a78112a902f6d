"""Skiff vs HF transformers on random-weight Llama / Qwen2 / Qwen3 / Mistral models saved as safetensors."""

from __future__ import annotations

import json

import pytest
import torch
from skiff import SamplingParams
from skiff_rt_helpers import (
    assert_divergences_acceptable,
    hf_greedy,
    hf_logits_fn,
    random_prompts,
    teacher_forced_divergences,
)
from support.random_models import RANDOM_MODELS

NEW_TOKENS = 64
PARITY_MODELS = [n for n in RANDOM_MODELS if n != "tiny_llama"]


@pytest.fixture(scope="module", params=PARITY_MODELS)
def pair(request, random_model, llm_factory_module):
    from transformers import AutoModelForCausalLM

    path = random_model(request.param)
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    llm = llm_factory_module(path, max_total_tokens=8192)
    return request.param, path, hf, llm


def test_checkpoint_layout(pair):
    name, path, _, _ = pair
    files = sorted(p.name for p in path.iterdir())
    if "sharded" in name:
        assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 1
        assert "rope_scaling" in json.loads((path / "config.json").read_text())
    else:
        assert "model.safetensors" in files


def test_greedy_matches_hf(pair):
    name, _, hf, llm = pair
    prompts = random_prompts(20, seed=1, lo=3, hi=150)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True))
    got = [o.token_ids for o in outs]
    assert all(len(g) == NEW_TOKENS for g in got)
    divs = teacher_forced_divergences(prompts, got, hf_logits_fn(hf))
    assert_divergences_acceptable(divs, len(prompts), f"{name} greedy vs HF")
    for i in (0, 7):  # and HF's own generate() on two of them
        ref = hf_greedy(hf, prompts[i], NEW_TOKENS)
        assert (
            ref == got[i]
            or all(d.near_tie for d in divs if d.prompt == i)
            and any(d.prompt == i for d in divs)
        )


def test_prefill_logits_close_to_hf(pair):
    name, _, hf, llm = pair
    for p in random_prompts(3, seed=2, lo=1, hi=300):
        ours = llm.prefill_logits(p)
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0].float()
        assert ours.shape == ref.shape
        err = (ours - ref).abs().max().item()
        assert err < 1e-3 * max(1.0, ref.abs().max().item()), f"{name}: max |logit diff| {err}"


def test_long_positions_match_hf(pair):
    """Past the original context of the rope-scaled configs (256), where llama3/yarn scaling matters most."""
    name, _, hf, llm = pair
    p = random_prompts(1, seed=3, lo=600, hi=600)[0]
    ours = llm.prefill_logits(p)
    with torch.no_grad():
        ref = hf(torch.tensor([p])).logits[0].float()
    err = (ours - ref).abs().max().item()
    assert err < 1e-3 * max(1.0, ref.abs().max().item()), f"{name}: max |logit diff| {err} at 600 positions"
