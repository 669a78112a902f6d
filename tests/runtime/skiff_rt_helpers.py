"""Shared helpers of the runtime tests: random-weight model builders, prompts and greedy comparisons.

Greedy comparisons follow one rule everywhere: batched fp32 arithmetic may flip a true near-tie, so a
divergence is accepted only where the reference's two best logits at that position are within TIE_TOL of
each other (and the engine chose one of those two), and for at most one prompt in twenty.
"""

from __future__ import annotations

import json
import random
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

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


# ---------------------------------------------------------------------------------------------- models

# Real configuration shapes (GQA, head_dim != hidden/heads for Qwen3, biases for Qwen2, rope scaling
# variants, tied and untied embeddings), scaled down to 2-4 layers so that they run in seconds on CPU.
RANDOM_MODELS: dict[str, dict] = {
    "llama_llama3_rope_sharded": dict(
        cls="LlamaConfig",
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
        _shard="3MB",
        _legacy_rope=True,
    ),
    "qwen2_tied_bias": dict(
        cls="Qwen2Config",
        hidden_size=128,
        intermediate_size=320,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    ),
    "qwen3_qknorm_yarn": dict(
        cls="Qwen3Config",
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
    ),
    "mistral_untied_mqa": dict(
        cls="MistralConfig",
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        rope_theta=1000000.0,
        sliding_window=None,
        tie_word_embeddings=False,
    ),
    # The model the engine-mechanics tests (cache, chunking, preemption) run on.
    "tiny_llama": dict(
        cls="LlamaConfig",
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    ),
}

VOCAB = 49152  # the SmolLM2 tokenizer's, saved next to every random model


def build_random_model(name: str, root: Path, tokenizer=None, seed: int = 0) -> Path:
    """Random weights from a real config shape, saved as safetensors (sharded when asked) into root/name."""
    import transformers
    from transformers import AutoModelForCausalLM

    spec = dict(RANDOM_MODELS[name])
    cls = getattr(transformers, spec.pop("cls"))
    shard = spec.pop("_shard", None)
    legacy_rope = spec.pop("_legacy_rope", False)
    # initializer_range 0.1 (not 0.02) keeps random logits decisive, so near-ties stay rare.
    cfg = cls(
        vocab_size=VOCAB, initializer_range=0.1, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, **spec
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # HF initialises norms to one and biases to zero: randomise them so loading shows
        for pname, p in model.named_parameters():
            if pname.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            elif "norm" in pname:
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.2)
    out = root / name
    model.save_pretrained(str(out), max_shard_size=shard) if shard else model.save_pretrained(str(out))
    if legacy_rope:  # the layout of real Llama-3.x config.json files: rope_theta + rope_scaling
        cfg_path = out / "config.json"
        raw = json.loads(cfg_path.read_text())
        params = raw.pop("rope_parameters")
        raw["rope_theta"] = params.pop("rope_theta")
        raw["rope_scaling"] = params
        cfg_path.write_text(json.dumps(raw, indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))
    return out


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
