"""Shared helpers of the runtime tests: random-weight model builders, prompts and greedy comparisons.

Greedy comparisons follow one rule everywhere: batched fp32 arithmetic may flip a true near-tie, so a
divergence is accepted only where the reference's two best logits at that position are within TIE_TOL of
each other (and the engine chose one of those two), and for at most one prompt in twenty.
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from support.random_models import VOCAB

TIE_TOL = 1e-3

# every engine the tests make; the autouse fixture checks each live one after every test
LIVE_ENGINES: weakref.WeakSet = weakref.WeakSet()


def make_llm(model=None, **kwargs):
    from skiff import LLM

    kwargs.setdefault("dtype", "float32")
    llm = LLM(model=None if model is None else str(model), **kwargs)
    LIVE_ENGINES.add(llm)
    return llm


def assert_engine_clean(llm) -> None:
    llm.engine.check_integrity()
    st = llm.engine.stats()
    assert st.num_running == 0 and st.num_queued == 0, f"requests left behind: {st}"
    assert st.used_pages == 0, f"pages still held by requests after all finished: {st}"
    assert st.free_pages + st.cached_pages == st.total_pages, f"pages leaked: {st}"


def random_prompts(
    n: int, seed: int, lo: int = 3, hi: int = 120, prefix: Sequence[int] = ()
) -> list[list[int]]:
    rng = random.Random(seed)
    # avoid ids 0-16 (special tokens of the SmolLM2 vocabulary) so no prompt contains an EOS
    return [list(prefix) + [rng.randrange(17, VOCAB) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


# ---------------------------------------------------------------------------------------------- prompts

CHAT_QUESTIONS = [
    "What is the capital of France?",
    "hi",
    "Write a haiku about the sea.",
    "Explain recursion to a child in three sentences, with an example involving mirrors and Russian dolls.",
    "List five prime numbers.",
    "What is 17 times 3?",
    "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?",
    "Give me a recipe for pancakes.",
    "Why is the sky blue?",
    "Summarize the plot of Cinderella in two sentences.",
    "What is the boiling point of water in Fahrenheit?",
    "Name three planets of the solar system.",
    "How do I reverse a list in Python?",
    "Tell me a short joke about computers.",
    "What are the primary colors?",
    "Describe a cat to someone who has never seen one. Mention its fur, its whiskers, its tail, the way it "
    "moves when it hunts, the sounds it makes when it is content and when it is angry, and why people keep "
    "cats as pets in apartments and on farms all over the world.",
    "What is photosynthesis?",
    "Suggest a name for a pet goldfish.",
    "How many days are in a leap year?",
    "What does a compiler do?",
    "Write one sentence about autumn leaves.",
]


def chat_prompt_ids(tokenizer, questions: Sequence[str] = CHAT_QUESTIONS) -> list[list[int]]:
    ids = []
    for q in questions:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        ids.append(list(tokenizer(text, add_special_tokens=False).input_ids))
    return ids


# ---------------------------------------------------------------------------------------------- comparisons


@dataclass
class Divergence:
    prompt: int
    position: int
    got: int
    expected: int
    gap: float  # reference logit of `expected` minus that of `got`
    top2_gap: float

    @property
    def near_tie(self) -> bool:
        return self.gap <= TIE_TOL and self.top2_gap <= TIE_TOL

    def __str__(self) -> str:
        return (
            f"prompt {self.prompt} position {self.position}: got {self.got}, reference {self.expected} "
            f"(logit gap {self.gap:.3g}, reference top-2 gap {self.top2_gap:.3g})"
        )


def teacher_forced_divergences(
    prompts: Sequence[list[int]],
    outputs: Sequence[list[int]],
    logits_along: Callable[[list[int]], torch.Tensor],
) -> list[Divergence]:
    """Every position where `outputs` is not the reference argmax given the same prefix.

    logits_along(ids) -> [len(ids), vocab] logits of the reference. If there is no divergence, the reference's
    greedy decoding produces exactly `outputs` (by induction over the positions).
    """
    found = []
    for i, (p, out) in enumerate(zip(prompts, outputs, strict=True)):
        if not out:
            continue
        logits = logits_along(list(p) + list(out[:-1])).float()
        steps = logits[len(p) - 1 :]
        assert steps.shape[0] == len(out)
        top2 = steps.topk(2, dim=-1)
        got = torch.tensor(out)
        for t in (top2.indices[:, 0] != got).nonzero().flatten().tolist():
            best = top2.values[t, 0].item()
            found.append(
                Divergence(
                    i,
                    t,
                    out[t],
                    top2.indices[t, 0].item(),
                    best - steps[t, out[t]].item(),
                    best - top2.values[t, 1].item(),
                )
            )
    return found


def assert_divergences_acceptable(divs: list[Divergence], num_prompts: int, what: str) -> None:
    hard = [d for d in divs if not d.near_tie]
    assert not hard, f"{what}: {len(hard)} real divergence(s):\n" + "\n".join(map(str, hard[:10]))
    tie_prompts = {d.prompt for d in divs}
    allowed = max(1, num_prompts // 20)
    assert len(tie_prompts) <= allowed, (
        f"{what}: near-tie divergences in {len(tie_prompts)} prompts (at most {allowed} accepted):\n"
        + "\n".join(map(str, divs))
    )


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for j, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return j
    return None if len(a) == len(b) else min(len(a), len(b))


def assert_same_greedy(
    prompts: Sequence[list[int]],
    got: Sequence[list[int]],
    ref: Sequence[list[int]],
    logits_along: Callable[[list[int]], torch.Tensor],
    what: str,
) -> None:
    """Two greedy runs must agree token for token, up to the near-tie rule (checked on the reference)."""
    divs = []
    for i, (p, a, b) in enumerate(zip(prompts, got, ref, strict=True)):
        j = first_difference(a, b)
        if j is None:
            continue
        assert j < min(len(a), len(b)), (
            f"{what}: prompt {i}: lengths differ ({len(a)} vs {len(b)}) with equal prefix"
        )
        logits = logits_along(list(p) + list(b[:j]))[-1].float()
        top2 = logits.topk(2)
        divs.append(
            Divergence(
                i,
                j,
                a[j],
                b[j],
                (logits[b[j]] - logits[a[j]]).abs().item(),
                (top2.values[0] - top2.values[1]).item(),
            )
        )
    assert_divergences_acceptable(divs, len(prompts), what)


def hf_logits_fn(model) -> Callable[[list[int]], torch.Tensor]:
    def along(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0].float()

    return along


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """HF generate, greedy, EOS disabled (the engine runs with ignore_eos)."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            min_new_tokens=0,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()
