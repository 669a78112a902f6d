"""`skiff serve --null-engine`: the real process set over an engine whose steps cost nothing, and the
multi-process load generator that measures it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from support.serve import ServerProcess
from test_bench_serve import bench_serve


@pytest.fixture(scope="module")
def null_server() -> Iterator[ServerProcess]:
    srv = ServerProcess("--null-engine", "--max-running-requests", "64").wait_ready()
    yield srv
    srv.stop()


def test_null_engine_streams_the_prompt_cycled(null_server: ServerProcess) -> None:
    from skiff.embedded import embedded_model_path
    from skiff.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(embedded_model_path())
    client = openai.OpenAI(base_url=null_server.url + "/v1", api_key=null_server.api_key, max_retries=0)
    prompt = tokenizer.encode(" the quick brown fox", add_special_tokens=False)
    model = client.models.list().data[0].id
    stream = client.completions.create(
        model=model, prompt=prompt, max_tokens=10, stream=True, temperature=0.0
    )
    text = "".join(c.choices[0].text for c in stream if c.choices)
    cycled = [prompt[i % len(prompt)] for i in range(10)]
    assert text == tokenizer.decode(cycled)
    with pytest.raises(openai.BadRequestError, match="context length"):
        client.completions.create(model=model, prompt=[17] * 9000, max_tokens=1)


def test_bench_serve_with_client_processes(null_server: ServerProcess, tmp_path: Path) -> None:
    args = ["--num-prompts", "24", "--random-input-len", "16", "--random-output-len", "40"]
    report = bench_serve(
        null_server, tmp_path / "bench.json", *args, "--num-clients", "2", "--max-concurrency", "8"
    )
    s = report["summary"]
    assert s["completed"] == 24 and s["failed"] == 0 and s["output_tokens"] == 24 * 40
    assert [c["index"] for c in s["clients"]] == [0, 1] and [c["requests"] for c in s["clients"]] == [12, 12]
    assert all(c["cpu_share"] > 0 and c["loop_lag_p99_ms"] >= 0 for c in s["clients"])
    assert s["client_saturated"] == any(c["saturated"] for c in s["clients"])
    assert len(report["requests"]) == 24 and all(
        r["ok"] and r["output_len"] == 40 for r in report["requests"]
    )
