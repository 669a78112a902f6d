"""Process-level behaviour: a dead scheduler fails fast and loudly, SIGTERM drains, TP=2 matches TP=1."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import openai
from serve_harness import ServerProcess

M = "SmolLM2-135M-Instruct"


def _stream_until_end(client: openai.OpenAI, results: list, i: int, started: threading.Event, **kw) -> None:
    try:
        finish, tokens = None, None
        for chunk in client.completions.create(model=M, stream=True, stream_options={"include_usage": True}, **kw):
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
        threads = [threading.Thread(target=_stream_until_end, args=(client, results, i, started),
                                    kwargs=dict(prompt=f"Story {i}:", max_tokens=1500, extra_body={"ignore_eos": True}))
                   for i in range(3)]
        for t in threads:
            t.start()
        non_stream: dict = {}

        def blocking() -> None:
            non_stream["r"] = httpx.post(srv.url + "/v1/completions", timeout=60,
                                         json={"prompt": "Long:", "max_tokens": 1500, "ignore_eos": True})

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
        threads = [threading.Thread(target=_stream_until_end, args=(client, results, i, started),
                                    kwargs=dict(prompt=f"Poem {i}:", max_tokens=16, extra_body={"ignore_eos": True}))
                   for i in range(4)]
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


def test_tp2_gives_the_same_greedy_answers_as_tp1(server: ServerProcess, client: openai.OpenAI) -> None:
    tp2 = ServerProcess("--tp", "2", api_key=None).wait_ready()
    try:
        client2 = openai.OpenAI(base_url=tp2.url + "/v1", api_key="none", timeout=120, max_retries=0)
        questions = ["What is the capital of France?", "Name three fruits.", "What is 2 + 2?"]
        for q in questions:
            kw = dict(model=M, messages=[{"role": "user", "content": q}], temperature=0, max_tokens=24)
            a1 = client.chat.completions.create(**kw).choices[0].message.content
            a2 = client2.chat.completions.create(**kw).choices[0].message.content
            assert a1 == a2, (q, a1, a2)
        assert tp2.integrity()["ok"]
    finally:
        assert tp2.stop() == 0
