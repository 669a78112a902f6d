"""HF transformers as the reference for Skiff on the same weights: the random-weight model both load, HF's
logits teacher-forced over given token trajectories, and the measures of how far two runs agree.

Used by the GPU tests (tests/gpu, which assert thresholds on these measures) and by agreement_floor.py
(which measures how far two correct runs of the same weights disagree).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

Trajectories = list[list[int]]
Preds = list[torch.Tensor]  # per prompt: [len(trajectory), vocab] logits, row j predicts trajectory[j]


def random_weights_model(config: Any, path: Path, device: str, dtype: torch.dtype, seed: int = 0) -> Any:
    """HF's own random initialisation saved as safetensors in path (Skiff loads the folder as a checkpoint),
    and the HF model reloaded from it, in eval mode on device."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config)
    model.to(dtype).save_pretrained(path)
    del model
    # Reloaded rather than kept: `.to(bf16)` also rounds the rotary `inv_freq` buffer to bf16 (a phase error
    # growing with position), which `from_pretrained(dtype=...)` keeps in fp32, as users get it.
    return load_reference(path, device, dtype)


def load_reference(path: Path, device: str, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


@torch.no_grad()
def teacher_forced(hf: Any, prompts: Trajectories, trajectories: Trajectories) -> Preds:
    """HF's fp32-cast logits over prompt + trajectory, the rows that predict each trajectory token."""
    device = next(hf.parameters()).device
    preds = []
    for p, o in zip(prompts, trajectories, strict=True):
        logits = hf(input_ids=torch.tensor([p + o], device=device)).logits[0].float()
        preds.append(logits[len(p) - 1 : len(p) - 1 + len(o)])
    return preds


@torch.no_grad()
def prefill(hf: Any, prompts: Trajectories) -> Preds:
    device = next(hf.parameters()).device
    return [hf(input_ids=torch.tensor([p], device=device)).logits[0].float().cpu() for p in prompts]


def hf_greedy(hf: Any, prompt: list[int], n_new: int) -> list[int]:
    """HF's own greedy tokens through `generate` (one query per step against its KV cache), EOS ignored."""
    ids = torch.tensor([prompt], device=next(hf.parameters()).device)
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n_new,
            min_new_tokens=n_new,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def random_prompts(n: int, lo: int, hi: int, vocab: int, seed: int = 7) -> Trajectories:
    """n prompts of lo..hi random ids below min(vocab, 10000)."""
    rng = random.Random(seed)
    top = min(vocab, 10000) - 1
    return [[rng.randint(0, top) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


@dataclass
class Agreement:
    """Share of positions where the reference's argmax is the run's token: strictly; counting exact ties
    (the reference gives the run's token the max too: its own pick among equal logits is just the lowest
    id); counting near-ties (the reference's gap <= 1 % of its max logit)."""

    strict: float
    exact_ties: float
    near_ties: float
    positions: int

    def as_tuple(self) -> tuple[float, float, float]:
        return self.strict, self.exact_ties, self.near_ties


def agreement(trajectories: Trajectories, preds: Preds) -> Agreement:
    agree = exact = ties = total = 0
    for o, pred in zip(trajectories, preds, strict=True):
        ref = pred.argmax(-1)
        mine = torch.tensor(o, device=pred.device)
        same = ref == mine
        gap = pred.gather(1, ref[:, None])[:, 0] - pred.gather(1, mine[:, None])[:, 0]
        agree += int(same.sum())
        exact += int(((~same) & (gap == 0)).sum())
        ties += int(((~same) & (gap <= 1e-2 * pred.abs().amax(-1))).sum())
        total += len(o)
    return Agreement(
        round(agree / total, 4), round((agree + exact) / total, 4), round((agree + ties) / total, 4), total
    )


def argmax_tokens(preds: Preds) -> Trajectories:
    return [p.argmax(-1).tolist() for p in preds]


def relative_error(ours: Preds, ref: Preds) -> tuple[float, float]:
    """(largest per-prompt ||ours - ref|| / ||ref||, share of rows whose argmax agrees)."""
    errs = [float((x.cpu() - y.cpu()).norm() / y.norm()) for x, y in zip(ours, ref, strict=True)]
    same = sum(int((x.cpu().argmax(-1) == y.cpu().argmax(-1)).sum()) for x, y in zip(ours, ref, strict=True))
    return round(max(errs), 5), round(same / sum(len(y) for y in ref), 4)


@dataclass
class Divergence:
    prompt: int
    position: int
    gap: float  # the reference's logit of the base token minus that of the other run's, over its max |logit|


def first_divergences(base: Trajectories, other: Trajectories, base_preds: Preds) -> list[Divergence]:
    """Where two greedy runs first part, per prompt that differs, with how close a call the reference
    (teacher-forced over base, so both runs saw the same prefix there) finds the two tokens."""
    out = []
    for i, (a, b, pred) in enumerate(zip(base, other, base_preds, strict=True)):
        j = next((k for k, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
        if j is not None:
            row = pred[j]
            out.append(Divergence(i, j, float((row[a[j]] - row[b[j]]).abs() / row.abs().max())))
    return out
