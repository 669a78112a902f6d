"""Process-level behaviour: a dead scheduler fails fast and loudly, SIGTERM drains, TP=2 matches TP=1."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
from serve_harness import ServerProcess

M = "SmolLM2-135M-Instruct"


def _stream_until_end(client: openai.OpenAI, results: list, i: int, started: threading.Event, **kw) -> None:
    try:
        finish, tokens = None, None
        for chunk in client.completions.create(
            model=M, stream=True, stream_options={"include_usage": True}, **kw
        ):
            if chunk.choices:
                started.set()
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        results[i] = ("finished", finish, tokens)
    except Exception as e:  # what we are testing for: an error, not a hang
        results[i] = ("error", repr(e))


def test_killed_scheduler_fails_health_and_inflight_requests() -> None:
    srv = ServerProcess(api_key=None).wait_ready()
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=60, max_retries=0)
        results: list = [None] * 3
        started = threading.Event()
        threads = [
            threading.Thread(
                target=_stream_until_end,
                args=(client, results, i, started),
                kwargs=dict(prompt=f"Story {i}:", max_tokens=1500, extra_body={"ignore_eos": True}),
            )
            for i in range(3)
        ]
        for t in threads:
            t.start()
        non_stream: dict = {}

        def blocking() -> None:
            non_stream["r"] = httpx.post(
                srv.url + "/v1/completions",
                timeout=60,
                json={"prompt": "Long:", "max_tokens": 1500, "ignore_eos": True},
            )

        tb = threading.Thread(target=blocking)
        tb.start()
        assert started.wait(120), srv.log()
        os.kill(srv.pids()["scheduler"], signal.SIGKILL)
        t0 = time.monotonic()
        unhealthy_after = None
        while time.monotonic() - t0 < 5.0:
            try:
                if httpx.get(srv.url + "/health", timeout=1).status_code != 200:
                    unhealthy_after = time.monotonic() - t0
                    break
            except httpx.HTTPError:
                unhealthy_after = time.monotonic() - t0
                break
            time.sleep(0.1)
        assert unhealthy_after is not None and unhealthy_after < 5.0
        for t in [*threads, tb]:
            t.join(20)
            assert not t.is_alive(), "an in-flight request hung after the scheduler died"
        assert all(r[0] == "error" for r in results), results
        assert non_stream["r"].status_code == 503 and "error" in non_stream["r"].json()
        # the process exits non-zero, so that Kubernetes restarts the pod
        assert srv.proc.wait(30) != 0
    finally:
        srv.stop()


def test_sigterm_drains_inflight_requests_then_exits_zero() -> None:
    srv = ServerProcess("--grace-period", "300", api_key=None).wait_ready()
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=300, max_retries=0)
        results: list = [None] * 4
        started = threading.Event()
        threads = [
            threading.Thread(
                target=_stream_until_end,
                args=(client, results, i, started),
                kwargs=dict(prompt=f"Poem {i}:", max_tokens=16, extra_body={"ignore_eos": True}),
            )
            for i in range(4)
        ]
        for t in threads:
            t.start()
        assert started.wait(120), srv.log()
        srv.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(300)
        assert results == [("finished", "length", 16)] * 4, results
        assert srv.proc.wait(60) == 0, srv.log()
        # and it really is gone: nothing listens any more
        try:
            httpx.get(srv.url + "/health", timeout=2)
            raise AssertionError("the server still answers after draining")
        except httpx.HTTPError:
            pass
    finally:
        srv.stop()


def _tiny_llama(root: Path) -> Path:
    """Random weights in a real Llama layout whose 8 heads / 2 KV heads split over two ranks
    (the embedded model's 9 heads do not)."""
    import torch
    from skiff.embedded import embedded_model_path
    from skiff.tokenizer import load_tokenizer
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    out = root / "tiny-llama"
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(str(out))
    load_tokenizer(embedded_model_path()).save_pretrained(str(out))
    return out


def test_tp2_gives_the_same_greedy_answers_as_tp1(tmp_path: Path) -> None:
    model = str(_tiny_llama(tmp_path))
    servers = [ServerProcess("--model", model, "--tp", str(tp), api_key=None) for tp in (1, 2)]
    try:
        for srv in servers:
            srv.wait_ready()
        clients = [
            openai.OpenAI(base_url=s.url + "/v1", api_key="none", timeout=120, max_retries=0) for s in servers
        ]
        prompts: list = ["The capital of France is", [17, 400, 9000, 123, 77], "def fibonacci(n):"]
        answers = [
            [
                c.completions.create(
                    model="tiny-llama",
                    prompt=p,
                    temperature=0,
                    max_tokens=16,
                    extra_body={"ignore_eos": True},
                )
                .choices[0]
                .text
                for p in prompts
            ]
            for c in clients
        ]
        assert answers[0] == answers[1]
        assert all(answers[0])
        chats = [
            c.chat.completions.create(
                model="tiny-llama",
                messages=[{"role": "user", "content": "Hi there"}],
                temperature=0,
                max_tokens=12,
            )
            .choices[0]
            .message.content
            for c in clients
        ]
        assert chats[0] == chats[1]
        assert servers[1].integrity()["ok"]
    finally:
        codes = [s.stop() for s in servers]
    assert codes == [0, 0]
