"""The OpenAI API of a live `skiff serve` (embedded SmolLM2-135M-Instruct), through the official client."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.serve import ServerProcess

PARIS = [{"role": "user", "content": "What is the capital of France?"}]


def fixed_length(client: openai.OpenAI, prompt, max_tokens: int, **kw):
    """A greedy completion that runs to exactly `max_tokens` (EOS ignored)."""
    return client.completions.create(
        model="SmolLM2-135M-Instruct",
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"ignore_eos": True},
        **kw,
    )


def metric_values(text: str) -> dict[str, float]:
    """name{sorted labels} -> value, for every sample (histogram buckets included)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def test_greedy_chat_answers_paris(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=PARIS, temperature=0, max_tokens=20
    )
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].message.role == "assistant"
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")


def test_stream_equals_non_stream(client: openai.OpenAI) -> None:
    kw = dict(model="SmolLM2-135M-Instruct", temperature=0, max_tokens=24)
    full = client.chat.completions.create(
        messages=[{"role": "user", "content": "Write a haiku about the sea."}], **kw
    )
    chunks = list(
        client.chat.completions.create(
            messages=[{"role": "user", "content": "Write a haiku about the sea."}],
            stream=True,
            stream_options={"include_usage": True},
            **kw,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content and text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].usage is not None and not chunks[-1].choices
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens

    # the same through /v1/completions with a text prompt
    prompt = "The three primary colours are"
    c_full = client.completions.create(
        model="SmolLM2-135M-Instruct", prompt=prompt, temperature=0, max_tokens=12
    )
    c_text = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="SmolLM2-135M-Instruct", prompt=prompt, temperature=0, max_tokens=12, stream=True
        )
        if c.choices
    )
    assert c_text == c_full.choices[0].text


def test_max_tokens_and_usage(client: openai.OpenAI) -> None:
    r = fixed_length(client, "Once upon a time", 7)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7
    tok_count = fixed_length(client, [[1, 2, 3, 4, 5]], 3)
    assert tok_count.usage.prompt_tokens == 5 and tok_count.usage.completion_tokens == 3
    assert tok_count.usage.total_tokens == 8
    chat = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=PARIS,
        max_completion_tokens=4,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert chat.usage.completion_tokens == 4 and chat.choices[0].finish_reason == "length"
    assert chat.usage.prompt_tokens > 10


def test_stop_strings(client: openai.OpenAI) -> None:
    kw = dict(model="SmolLM2-135M-Instruct", messages=PARIS, temperature=0, max_tokens=30)
    base = client.chat.completions.create(**kw).choices[0].message.content
    assert "Paris" in base
    # stop at a word in the middle of the greedy answer: text ends right before it, reason "stop"
    stopped = client.chat.completions.create(stop=["Paris"], **kw)
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == base[: base.index("Paris")]
    assert stopped.usage.completion_tokens < client.chat.completions.create(**kw).usage.completion_tokens
    # streamed, a stop string never leaks partially
    text = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(stop=["Paris", "zzz"], stream=True, **kw)
        if c.choices
    )
    assert text == stopped.choices[0].message.content
    # a stop string that never occurs changes nothing
    assert client.chat.completions.create(stop="qwertyuiop", **kw).choices[0].message.content == base


def test_completions_logprobs(client: openai.OpenAI) -> None:
    r = fixed_length(client, "The capital of France is", 5, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert "".join(lp.tokens) == r.choices[0].text
    for chosen, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value <= 0.0
        assert 1 <= len(top) <= 3
        # greedy: the chosen token is the most likely one
        assert max(top.values()) == pytest.approx(value, abs=1e-4)
        assert chosen in top
    assert lp.text_offset[0] == 0


def test_chat_logprobs_and_n(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=PARIS,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        n=2,
    )
    assert len(r.choices) == 2 and [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].message.content == r.choices[1].message.content  # greedy
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 for t in content)
    sampled = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=PARIS, max_tokens=12, temperature=1.0, seed=7, n=3
    )
    again = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=PARIS, max_tokens=12, temperature=1.0, seed=7, n=3
    )
    assert [c.message.content for c in sampled.choices] == [c.message.content for c in again.choices]
    assert 3 <= sampled.usage.completion_tokens <= 36
    assert sampled.usage.prompt_tokens == r.usage.prompt_tokens  # counted once, not once per choice


def test_models_and_health(server: ServerProcess, client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct"]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    r = httpx.get(server.url + "/health_generate", timeout=60)
    assert r.status_code == 200 and r.json()["completion_tokens"] == 1
    r = httpx.post(
        server.url + "/v1/completions",
        headers=server.headers | {"x-request-id": "my-req-42"},
        json={"prompt": "Hi", "max_tokens": 2},
    )
    assert r.status_code == 200 and r.headers["x-request-id"] == "my-req-42" and r.json()["id"] == "my-req-42"


def test_metrics_parse_and_move(server: ServerProcess, client: openai.OpenAI) -> None:
    before = metric_values(server.metrics_text())
    for name in [
        "sglang:num_queue_reqs",
        "sglang:num_running_reqs",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "sglang:gen_throughput",
        "skiff:kv_pages_used",
        "skiff:kv_pages_free",
    ]:
        assert name in before, name
    assert any(k.startswith("sglang:cache_config_info{num_pages=") for k in before)
    fixed_length(client, "Count: one, two,", 9)
    after = metric_values(server.metrics_text())
    assert after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"] == 9
    assert after["sglang:prompt_tokens_total"] > before["sglang:prompt_tokens_total"]
    assert (
        after["sglang:time_to_first_token_seconds_count"]
        == before["sglang:time_to_first_token_seconds_count"] + 1
    )
    assert (
        after["sglang:e2e_request_latency_seconds_count"]
        == before["sglang:e2e_request_latency_seconds_count"] + 1
    )
    assert (
        after["sglang:inter_token_latency_seconds_count"]
        >= before["sglang:inter_token_latency_seconds_count"] + 8
    )
    assert "sglang:cached_tokens_total" in after


def test_an_unexpected_error_is_a_counted_500(server: ServerProcess) -> None:
    """An exception no route expects (here the engine's integrity check timing out while the scheduler is
    stopped) answers 500 in OpenAI's error format and counts in skiff:http_errors like every error."""

    def errors_500() -> float:
        return metric_values(server.metrics_text()).get("skiff:http_errors_total{status=500}", 0.0)

    before = errors_500()
    scheduler = server.pids()["scheduler"]
    os.kill(scheduler, signal.SIGSTOP)
    try:
        r = httpx.get(server.url + "/skiff/integrity", timeout=30)
    finally:
        os.kill(scheduler, signal.SIGCONT)
    assert r.status_code == 500 and r.json()["error"]["type"] == "internal_server_error"
    assert "TimeoutError" in r.json()["error"]["message"]
    assert errors_500() == before + 1
    server.wait_idle()


def test_prefix_cache_hits_show_in_usage(client: openai.OpenAI) -> None:
    long_prompt = "You are a careful assistant. " * 20 + "Question: what is two plus two?"
    kw = dict(model="SmolLM2-135M-Instruct", prompt=long_prompt, max_tokens=2, temperature=0)
    client.completions.create(**kw)
    second = client.completions.create(**kw)
    assert second.usage.prompt_tokens_details.cached_tokens > 0


def test_200_concurrent_streams_then_no_page_leak(server: ServerProcess) -> None:
    aclient = openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key=server.api_key, timeout=300, max_retries=0
    )

    async def one(i: int) -> tuple[int, int, str]:
        max_tokens = 2 + i % 5
        stream = await aclient.completions.create(
            model="SmolLM2-135M-Instruct",
            prompt=f"Request number {i}: the weather today is",
            max_tokens=max_tokens,
            temperature=0.8,
            seed=i,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        text, usage, finish = "", None, None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage
        assert finish == "length"
        return max_tokens, usage.completion_tokens, text

    async def run_all() -> list[tuple[int, int, str]]:
        try:
            return await asyncio.gather(*(one(i) for i in range(200)))
        finally:
            await aclient.close()

    results = asyncio.run(run_all())
    assert len(results) == 200
    assert all(want == got for want, got, _ in results), [r[:2] for r in results if r[0] != r[1]][:5]
    assert all(text for _, _, text in results)
    report = server.wait_idle()
    assert report["ok"], report
    assert report["stats"]["used_pages"] == 0
    values = metric_values(server.metrics_text())
    assert values["skiff:kv_pages_used"] == 0


def test_disconnect_mid_stream_frees_pages(server: ServerProcess) -> None:
    body = {
        "model": "SmolLM2-135M-Instruct",
        "prompt": "Tell me a very long story about dragons.",
        "max_tokens": 1500,
        "stream": True,
        "ignore_eos": True,
    }
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", server.url + "/v1/completions", headers=server.headers, json=body) as r,
    ):
        assert r.status_code == 200
        lines, it = 0, r.iter_lines()  # no `break` out of iter_lines: that would close the stream early
        while lines < 5:
            lines += next(it).startswith("data:")
        running = server.integrity()["stats"]
        assert running["used_pages"] > 0
    # the client is gone: the request must be aborted and its pages freed long before 1500 tokens
    t0 = time.monotonic()
    report = server.wait_idle(timeout=20)
    assert report["ok"] and report["stats"]["used_pages"] == 0
    assert time.monotonic() - t0 < 20

    # a non-streaming client that gives up frees its pages too
    with pytest.raises(httpx.TimeoutException):
        httpx.post(
            server.url + "/v1/completions", headers=server.headers, json=body | {"stream": False}, timeout=2
        )
    report = server.wait_idle(timeout=20)
    assert report["ok"] and report["stats"]["used_pages"] == 0
