"""TP=2 (two processes over gloo) gives the same greedy output as TP=1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from skiff import SamplingParams
from skiff_rt_helpers import assert_same_greedy, make_llm, random_prompts
from support.process import Process

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=8, seed=5, ignore_eos=True)


def _run(path, tp: int, prompts):
    llm = make_llm(path, tp=tp, max_total_tokens=4096)
    try:
        greedy = [o.token_ids for o in llm.generate(prompts, GREEDY)]
        sampled = [o.token_ids for o in llm.generate(prompts[:2], SAMPLED)]
        logits = llm.prefill_logits(prompts[0])
        return greedy, sampled, logits
    finally:
        llm.engine.check_integrity()
        llm.shutdown()


# Qwen3: 4 q / 2 kv heads split evenly; Mistral: one KV head, replicated on both ranks; Llama: sharded weights.
@pytest.mark.parametrize("name", ["qwen3_qknorm_yarn", "mistral_untied_mqa", "llama_llama3_rope_sharded"])
def test_tp2_equals_tp1(random_model, name):
    path = random_model(name)
    prompts = random_prompts(6, seed=80, lo=2, hi=200)
    # one engine at a time: see test_tp1_and_tp2_engines_coexist for two alive at once
    ref, ref_sampled, ref_logits = _run(path, 1, prompts)
    got, sampled, logits = _run(path, 2, prompts)
    reference = make_llm(path, tp=1, max_total_tokens=4096)
    try:
        assert_same_greedy(prompts, got, ref, reference.prefill_logits, f"{name} tp=2 vs tp=1")
    finally:
        reference.shutdown()
    assert logits.shape == ref_logits.shape
    err = (logits - ref_logits).abs().max().item()
    assert err < 1e-3 * max(1.0, ref_logits.abs().max().item()), err
    # seeded sampling: rank 0 samples, the follower replays the same batch; the result matches TP=1
    assert sampled == ref_sampled


def test_tp1_and_tp2_engines_coexist(random_model, tmp_path):
    """Two live LLMs of different TP sizes in one process stay independent (bounded: run in a subprocess)."""
    path = random_model("qwen3_qknorm_yarn")
    script = textwrap.dedent(f"""
        from skiff import LLM, SamplingParams
        p = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        one = LLM(model={str(path)!r}, tp=1, dtype="float32", max_total_tokens=2048)
        a = one.generate([[5, 6, 7]], p)[0].token_ids
        two = LLM(model={str(path)!r}, tp=2, dtype="float32", max_total_tokens=2048)
        b = two.generate([[5, 6, 7]], p)[0].token_ids
        c = one.generate([[5, 6, 7]], p)[0].token_ids  # the tp=1 engine after a tp=2 one started
        one.shutdown()
        d = two.generate([[5, 6, 7]], p)[0].token_ids  # the tp=2 engine after the tp=1 one shut down
        two.shutdown()
        assert a == b == c == d, (a, b, c, d)
        print("OK")
    """)
    # its own session, so that a hang takes the TP follower process down with it
    proc = Process([sys.executable, "-c", script], log_path=tmp_path / "tp.log", new_session=True)
    try:
        proc.proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.proc.wait()
        pytest.fail(
            "a tp=1 LLM hangs once a tp=2 LLM exists in the same process (TP state is process-global)"
        )
    assert proc.proc.returncode == 0 and "OK" in proc.log(), proc.log(3000)
