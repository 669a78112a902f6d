"""Sampling on the embedded SmolLM2: seeds, top-k, stop tokens, the sampled distribution, penalties, logprobs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from skiff import SamplingParams
from skiff_rt_helpers import TIE_TOL, chat_prompt_ids

QUESTIONS = [
    "Tell me about your favourite food.",
    "Write a short poem about rain.",
    "What is a black hole?",
    "Give three tips for learning to cook.",
]


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    return chat_prompt_ids(tokenizer, QUESTIONS)


def test_same_seed_same_output(smollm, prompts):
    p = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=24, seed=1234, ignore_eos=True)
    a = [o.token_ids for o in smollm.generate(prompts, p)]
    # again, in another order and batched with unseeded companions: a seed owns its own random stream
    others = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)
    mixed = smollm.generate(prompts[::-1] + prompts, [p] * 4 + [others] * 4)
    assert [o.token_ids for o in mixed[:4]][::-1] == a
    b = [
        o.token_ids
        for o in smollm.generate(
            prompts, SamplingParams(temperature=0.9, top_p=0.95, max_tokens=24, seed=99, ignore_eos=True)
        )
    ]
    assert b != a  # another seed draws other tokens (24 tokens x 4 prompts at T=0.9 cannot all agree)


def test_top_k_1_is_greedy(smollm, prompts):
    greedy = smollm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    topk1 = smollm.generate(prompts, SamplingParams(temperature=1.5, top_k=1, max_tokens=24, ignore_eos=True))
    assert [o.token_ids for o in topk1] == [o.token_ids for o in greedy]


def test_stop_token_ids_end_generation(smollm, prompts):
    greedy = smollm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))[0]
    g = greedy.token_ids
    k = next(i for i in range(3, len(g)) if g[i] not in g[:i])
    out = smollm.generate(
        prompts[:1], SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, stop_token_ids=[g[k]])
    )[0]
    assert out.finish_reason == "stop"
    assert out.token_ids in (g[:k], g[: k + 1]), (out.token_ids, g[: k + 1])


def test_eos_ends_generation_unless_ignored(smollm, tokenizer):
    ids = chat_prompt_ids(tokenizer, ["What is the capital of France?"])
    stop = smollm.generate(ids, SamplingParams(temperature=0.0, max_tokens=40))[0]
    assert stop.finish_reason == "stop" and len(stop.token_ids) < 40
    assert stop.token_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    cont = smollm.generate(ids, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))[0]
    assert cont.finish_reason == "length" and len(cont.token_ids) == 40
    assert cont.token_ids[: len(stop.token_ids)] == stop.token_ids


# ---------------------------------------------------------------------------------------------- distribution


def _expected(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    if top_p < 1.0:
        sp, order = probs.sort(descending=True)
        keep = (sp.cumsum(0) - sp) < top_p
        keep[0] = True
        probs = torch.zeros_like(probs).scatter_(0, order, sp * keep)
        probs /= probs.sum()
    return probs


def _chi2_pvalue(counts: np.ndarray, expected_p: np.ndarray, n: int) -> float:
    """Pearson chi-square over bins with expected count >= 5; all the rest merged into one bin."""
    exp = expected_p * n
    big = exp >= 5
    obs_b, exp_b = list(counts[big]), list(exp[big])
    rest_o, rest_e = counts[~big].sum(), exp[~big].sum()
    if rest_e >= 5:
        obs_b.append(rest_o)
        exp_b.append(rest_e)
    else:  # too small a bin: fold it into the smallest regular one
        j = int(np.argmin(exp_b))
        obs_b[j] += rest_o
        exp_b[j] += rest_e
    exp_arr = np.array(exp_b)
    exp_arr *= sum(obs_b) / exp_arr.sum()
    return float(chisquare(np.array(obs_b), exp_arr).pvalue)


@pytest.fixture(scope="module")
def spread_prompt(smollm, tokenizer):
    """A prompt whose next-token distribution is spread out, and its logits."""
    candidates = [
        "My favourite animal is the",
        "She opened the box and found a",
        "The best colour for a car is",
    ]
    best = None
    for text in candidates:
        ids = list(tokenizer.encode(text, add_special_tokens=True))
        logits = smollm.prefill_logits(ids)[-1]
        ent = torch.distributions.Categorical(logits=logits.double()).entropy().item()
        if best is None or ent > best[2]:
            best = (ids, logits, ent)
    assert best[2] > 2.0, f"no candidate prompt has a spread next-token distribution: {best[2]}"
    # with the prompt in the prefix cache, each sample below only computes the prompt's last page
    smollm.generate([best[0]], SamplingParams(max_tokens=1))
    return best[0], best[1]


def _sample_counts(smollm, ids, params_for_seed, n) -> np.ndarray:
    outs = smollm.generate([ids] * n, [params_for_seed(s) for s in range(n)])
    counts = np.zeros(smollm.engine.model_config.vocab_size, dtype=np.int64)
    for o in outs:
        assert len(o.token_ids) == 1
        counts[o.token_ids[0]] += 1
    return counts


N_SAMPLES = 600
ALPHA = 1e-4  # false-alarm probability of one check


def test_temperature_samples_softmax_over_t(smollm, spread_prompt):
    ids, logits = spread_prompt
    t = 0.7
    counts = _sample_counts(
        smollm, ids, lambda s: SamplingParams(temperature=t, max_tokens=1, seed=s), N_SAMPLES
    )
    p = _expected(logits, t, 1.0).numpy()
    assert _chi2_pvalue(counts, p, N_SAMPLES) > ALPHA
    # the check has power: the same counts are rejected against the untempered distribution
    assert _chi2_pvalue(counts, _expected(logits, 1.0, 1.0).numpy(), N_SAMPLES) < ALPHA


def test_top_p_samples_the_renormalised_nucleus(smollm, spread_prompt):
    ids, logits = spread_prompt
    t = 1.1
    probs = _expected(logits, t, 1.0)
    sp = probs.sort(descending=True).values
    k = int((sp >= 0.01).sum().item())  # the nucleus: every token of >= 1% probability
    assert k >= 3 and sp[k:].sum() > 0.1, (k, sp[:10])
    top_p = float(
        sp[: k - 1].sum() + sp[k - 1] / 2
    )  # strictly inside rank k-1's share: keeps exactly k tokens
    expected = _expected(logits, t, top_p)
    nucleus = set((expected > 0).nonzero().flatten().tolist())
    assert 3 <= len(nucleus) < (probs > 1e-6).sum().item()
    counts = _sample_counts(
        smollm,
        ids,
        lambda s: SamplingParams(temperature=t, top_p=top_p, max_tokens=1, seed=10_000 + s),
        N_SAMPLES,
    )
    outside = {i: int(c) for i, c in enumerate(counts) if c and i not in nucleus}
    assert not outside, f"sampled tokens outside the top-p set: {outside}"
    assert _chi2_pvalue(counts, expected.numpy(), N_SAMPLES) > ALPHA
    assert _chi2_pvalue(counts, probs.numpy(), N_SAMPLES) < ALPHA  # power: not the unfiltered distribution


def test_top_k_and_min_p_restrict_the_support(smollm, spread_prompt):
    ids, logits = spread_prompt
    probs = _expected(logits, 1.0, 1.0)
    top5 = set(probs.topk(5).indices.tolist())
    counts = _sample_counts(
        smollm, ids, lambda s: SamplingParams(temperature=1.0, top_k=5, max_tokens=1, seed=20_000 + s), 200
    )
    assert set(np.nonzero(counts)[0].tolist()) <= top5
    expected = torch.zeros_like(probs)
    expected[list(top5)] = probs[list(top5)]
    assert _chi2_pvalue(counts, (expected / expected.sum()).numpy(), 200) > ALPHA
    min_p = 0.3
    allowed = set((probs >= min_p * probs.max()).nonzero().flatten().tolist())
    counts = _sample_counts(
        smollm,
        ids,
        lambda s: SamplingParams(temperature=1.0, min_p=min_p, max_tokens=1, seed=30_000 + s),
        150,
    )
    assert set(np.nonzero(counts)[0].tolist()) <= allowed


# ---------------------------------------------------------------------------------------------- penalties


def _penalised_argmax_divergences(
    smollm, prompt, out, rep=1.0, freq=0.0, pres=0.0
) -> list[tuple[int, float]]:
    """Positions where `out` is not the greedy choice under the penalties applied to the reference logits.

    Semantics (OpenAI / HF): repetition penalty divides positive and multiplies negative logits of every
    token seen in prompt or output; frequency and presence penalties subtract count * f + p for tokens of
    the output so far.
    """
    logits = smollm.prefill_logits(prompt + out[:-1])[len(prompt) - 1 :].double()
    bad = []
    for t, tok in enumerate(out):
        row = logits[t].clone()
        seen = sorted(set(prompt) | set(out[:t]))
        if rep != 1.0:
            vals = row[seen]
            row[seen] = torch.where(vals > 0, vals / rep, vals * rep)
        if out[:t]:
            ids, cnt = torch.tensor(out[:t]).unique(return_counts=True)
            row[ids] -= freq * cnt.double() + pres
        best = row.max().item()
        if row.argmax().item() != tok:
            bad.append((t, best - row[tok].item()))
    return bad


def _repeats(tokens: list[int]) -> int:
    return len(tokens) - len(set(tokens))


@pytest.mark.parametrize(
    ("rep", "freq", "pres"), [(1.3, 0.0, 0.0), (1.0, 1.0, 0.0), (1.0, 0.0, 1.5), (1.0, 0.0, -1.0)]
)
def test_penalties(smollm, tokenizer, rep, freq, pres):
    prompt = chat_prompt_ids(tokenizer, ["Repeat the word 'hello' twenty times."])[0]
    n = 48
    plain = smollm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))[
        0
    ].token_ids
    pen = smollm.generate(
        [prompt],
        SamplingParams(
            temperature=0.0,
            max_tokens=n,
            ignore_eos=True,
            repetition_penalty=rep,
            frequency_penalty=freq,
            presence_penalty=pres,
        ),
    )[0].token_ids
    bad = _penalised_argmax_divergences(smollm, prompt, pen, rep, freq, pres)
    assert all(gap <= TIE_TOL for _, gap in bad), f"not the penalised greedy choice at {bad}"
    assert len(bad) <= 1
    if pres < 0:
        assert _repeats(pen) >= _repeats(plain)
    else:
        assert _repeats(plain) > 0 and _repeats(pen) < _repeats(plain), (plain, pen)


# ---------------------------------------------------------------------------------------------- logprobs


def test_logprobs_match_log_softmax_of_prefill_logits(smollm, prompts):
    for params in (
        SamplingParams(temperature=0.0, max_tokens=16, logprobs=True, top_logprobs=5, ignore_eos=True),
        SamplingParams(
            temperature=0.8, max_tokens=16, logprobs=True, top_logprobs=3, seed=3, ignore_eos=True
        ),
    ):
        out = smollm.generate(prompts[:2], params)
        for p, o in zip(prompts[:2], out, strict=True):
            assert len(o.logprobs) == len(o.token_ids) == 16 and len(o.top_logprobs) == 16
            ref = torch.log_softmax(
                smollm.prefill_logits(p + o.token_ids[:-1])[len(p) - 1 :].double(), dim=-1
            )
            for t, tok in enumerate(o.token_ids):
                assert abs(o.logprobs[t] - ref[t, tok].item()) < 2e-3
                top = o.top_logprobs[t]
                assert len(top) == params.top_logprobs
                vals, idx = ref[t].topk(params.top_logprobs)
                for tid, lp in top.items():
                    assert abs(lp - ref[t, tid].item()) < 2e-3
                assert sorted(top.values(), reverse=True)[-1] >= vals[-1].item() - 2e-3
                if params.temperature == 0.0:
                    assert tok == max(top, key=top.get) or abs(top[tok] - max(top.values())) < TIE_TOL
