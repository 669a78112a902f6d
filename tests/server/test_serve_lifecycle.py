"""Process-level behaviour: a dead scheduler fails fast and loudly, SIGTERM drains, TP=2 matches TP=1."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import httpx
import openai
import pytest
from support.process import http_ok
from support.random_models import build_random_model
from support.serve import ServerProcess
from support.waiting import wait_for

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


def start_streams(
    srv: ServerProcess, prompt: str, n: int, max_tokens: int, timeout: float
) -> tuple[list[threading.Thread], list]:
    """`n` streaming completions of `prompt` + its index on threads; returns them and their results once
    the first token of one has arrived."""
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", timeout=timeout, max_retries=0)
    results: list = [None] * n
    started = threading.Event()
    threads = [
        threading.Thread(
            target=_stream_until_end,
            args=(client, results, i, started),
            kwargs=dict(prompt=f"{prompt} {i}:", max_tokens=max_tokens, extra_body={"ignore_eos": True}),
        )
        for i in range(n)
    ]
    for t in threads:
        t.start()
    assert started.wait(120), srv.log()
    return threads, results


def test_killed_scheduler_fails_health_and_inflight_requests() -> None:
    srv = ServerProcess(api_key=None).wait_ready()
    try:
        threads, results = start_streams(srv, "Story", 3, max_tokens=1500, timeout=60)
        non_stream: dict = {}

        def blocking() -> None:
            non_stream["r"] = httpx.post(
                srv.url + "/v1/completions",
                timeout=60,
                json={"prompt": "Long:", "max_tokens": 1500, "ignore_eos": True},
            )

        tb = threading.Thread(target=blocking)
        tb.start()
        os.kill(srv.pids()["scheduler"], signal.SIGKILL)
        wait_for(lambda: not http_ok(srv.url + "/health", 1), 5.0, "/health to fail", interval=0.1)
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
        threads, results = start_streams(srv, "Poem", 4, max_tokens=16, timeout=300)
        srv.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(300)
        assert results == [("finished", "length", 16)] * 4, results
        assert srv.proc.wait(60) == 0, srv.log()
        with pytest.raises(httpx.HTTPError):  # and it really is gone: nothing listens any more
            httpx.get(srv.url + "/health", timeout=2)
    finally:
        srv.stop()


def _tiny_llama(root: Path) -> Path:
    """Random weights whose 8 heads / 2 KV heads split over two ranks (the embedded model's 9 do not)."""
    from skiff.embedded import embedded_model_path
    from skiff.tokenizer import load_tokenizer

    return build_random_model("tiny_llama", root, load_tokenizer(embedded_model_path()))


def test_tp2_gives_the_same_greedy_answers_as_tp1(tmp_path: Path) -> None:
    model = str(_tiny_llama(tmp_path))
    served = Path(model).name
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
                    model=served,
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
                model=served,
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
