"""The engine's one loop: the overlap lag (1) produces what the synchronous lag (0) produces, on CPU."""

from __future__ import annotations

import time

import pytest
import torch
from skiff.config import EngineConfig
from skiff.engine.engine import schedule_lag
from skiff.params import SamplingParams
from skiff_rt_helpers import assert_same_greedy, chat_prompt_ids


@pytest.mark.parametrize(
    ("cfg", "device", "lag"),
    [
        (EngineConfig(), "cpu", 0),
        (EngineConfig(overlap_on_cpu=True), "cpu", 1),
        (EngineConfig(), "cuda", 1),
        (EngineConfig(disable_overlap=True), "cuda", 0),
        (EngineConfig(tp=2), "cuda", 0),
    ],
)
def test_schedule_lag(cfg: EngineConfig, device: str, lag: int) -> None:
    assert schedule_lag(cfg, torch.device(device)) == lag


def _mixed_params(n: int) -> list[SamplingParams]:
    """Natural EOS stops, length limits, penalties (which drain the lag), seeded sampling, logprobs."""
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append(SamplingParams(temperature=0.0, max_tokens=48))
        elif kind == 1:
            out.append(SamplingParams(temperature=0.0, max_tokens=5 + i, logprobs=True, top_logprobs=2))
        elif kind == 2:
            out.append(SamplingParams(temperature=0.0, max_tokens=24, repetition_penalty=1.3))
        else:
            out.append(SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=24))
    return out


@pytest.fixture(scope="module")
def overlap_llm(llm_factory_module):
    return llm_factory_module(None, max_total_tokens=16384, overlap_on_cpu=True, quantization="none")


def test_overlap_lag_matches_the_synchronous_loop(smollm, overlap_llm, tokenizer) -> None:
    assert smollm.engine.lag == 0 and overlap_llm.engine.lag == 1
    prompts = chat_prompt_ids(tokenizer)[:12]
    params = _mixed_params(len(prompts))
    sync = smollm.generate(prompts, params)
    lagged = overlap_llm.generate(prompts, params)
    reasons = {r.finish_reason for r in sync}
    assert reasons == {"stop", "length"}, reasons
    for a, b, p in zip(lagged, sync, params, strict=True):
        assert a.finish_reason == b.finish_reason, (a.rid, a.finish_reason, b.finish_reason)
        assert len(a.token_ids) <= p.max_tokens
        if a.finish_reason == "stop":
            assert a.token_ids[-1] in smollm.engine.eos_token_ids
        if p.logprobs:
            assert a.logprobs is not None and b.logprobs is not None
            assert len(a.logprobs) == len(a.token_ids) and len(a.top_logprobs or []) == len(a.token_ids)
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-3, rtol=0)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    assert_same_greedy(
        [prompts[i] for i in greedy],
        [lagged[i].token_ids for i in greedy],
        [sync[i].token_ids for i in greedy],
        lambda ids: smollm.prefill_logits(ids),
        "lag 1 vs lag 0",
    )
    seeded = [i for i, p in enumerate(params) if not p.greedy]
    assert all(lagged[i].token_ids == sync[i].token_ids for i in seeded)
    st = overlap_llm.engine.stats()
    assert st.generation_tokens >= sum(len(r.token_ids) for r in lagged)


def test_abort_while_a_batch_is_pending(overlap_llm, tokenizer) -> None:
    engine = overlap_llm.engine
    prompts = chat_prompt_ids(tokenizer)[:4]
    for i, ids in enumerate(prompts):
        engine.add_request(
            f"pending-{i}", ids, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        )
    got: dict[str, list[int]] = {f"pending-{i}": [] for i in range(len(prompts))}
    reasons: dict[str, str | None] = {}
    for _ in range(3):
        for out in engine.step():
            got[out.rid].extend(out.token_ids)
    assert engine._pending is not None  # a batch is in flight when the abort arrives
    engine.abort_request("pending-1")
    while engine.has_work:
        for out in engine.step():
            got[out.rid].extend(out.token_ids)
            if out.finished:
                reasons[out.rid] = out.finish_reason
                assert out.completion_tokens == len(got[out.rid])
    assert reasons["pending-1"] == "abort" and len(got["pending-1"]) < 16
    assert all(reasons[f"pending-{i}"] == "length" and len(got[f"pending-{i}"]) == 16 for i in (0, 2, 3))
    assert all(t >= 0 for toks in got.values() for t in toks)  # no placeholder ever leaves the engine


def _first_token_timings(engine, prompts: list[list[int]], max_tokens: int) -> None:
    """Each request's RequestTiming comes once, in the step whose outputs hold its first token; the first
    request says when it began to wait (as the server's tokenizer does), the others wait from now."""
    tokenized = time.time_ns() - 5_000_000
    for i, ids in enumerate(prompts):
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        engine.add_request(f"t-{i}", ids, params, tokenized if i == 0 else 0)
    added = time.time_ns()
    timings = {}
    while engine.has_work:
        outs = engine.step()
        firsts = {o.rid for o in outs if o.token_ids and o.completion_tokens == 1}
        assert {t.rid for t in engine.timings} == firsts
        for t in engine.timings:
            assert t.rid not in timings
            timings[t.rid] = t
    assert timings.keys() == {f"t-{i}" for i in range(len(prompts))}
    assert timings["t-0"].queued == tokenized
    for t in timings.values():
        assert tokenized <= t.queued <= added <= t.scheduled <= t.first_token, t
    # more requests than running slots: the later ones waited for the first ones to finish
    assert max(t.scheduled for t in timings.values()) >= min(t.first_token for t in timings.values())


@pytest.mark.parametrize("llm", ["smollm", "overlap_llm"])
def test_engine_reports_each_requests_timing_with_its_first_token(llm, request, tokenizer) -> None:
    engine = request.getfixturevalue(llm).engine
    limit = engine.cfg.max_running_requests
    engine.cfg.max_running_requests = 2
    try:
        _first_token_timings(engine, chat_prompt_ids(tokenizer)[:4], max_tokens=3)
    finally:
        engine.cfg.max_running_requests = limit


def test_null_engine_reports_the_same_timings(tokenizer) -> None:
    from skiff.engine.null import NullEngine

    _first_token_timings(NullEngine(EngineConfig(max_running_requests=2)), chat_prompt_ids(tokenizer)[:4], 3)
