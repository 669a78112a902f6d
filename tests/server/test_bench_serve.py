"""`skiff bench serve` against the live test server: counts, percentiles and JSON are real."""

from __future__ import annotations

import json
from pathlib import Path

from serve_harness import ServerProcess
from skiff.cli import main


def test_bench_serve_random_and_shared_prefix(server: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "serve",
            "--base-url",
            server.url + "/v1",
            "--api-key",
            server.api_key or "",
            "--num-prompts",
            "4",
            "--random-input-len",
            "24",
            "--random-output-len",
            "5",
            "--max-concurrency",
            "2",
            "--no-progress",
            "--output-json",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    s = report["summary"]
    assert s["completed"] == 4 and s["failed"] == 0
    assert s["output_tokens"] == 4 * 5  # EOS ignored: every request runs to max_tokens
    assert all(r["output_len"] == 5 and r["ttft"] > 0 for r in report["requests"])
    assert 0 < s["ttft_ms"]["p50"] <= s["ttft_ms"]["p99"]
    assert s["itl_ms"]["p50"] > 0 and s["output_throughput"] > 0

    out2 = tmp_path / "prefix.json"
    code = main(
        [
            "bench",
            "serve",
            "--base-url",
            server.url + "/v1",
            "--api-key",
            server.api_key or "",
            "--api",
            "chat",
            "--dataset",
            "shared-prefix",
            "--shared-prefix-groups",
            "1",
            "--shared-prefix-len",
            "96",
            "--shared-suffix-len",
            "8",
            "--num-prompts",
            "3",
            "--random-output-len",
            "3",
            "--request-rate",
            "20",
            "--no-progress",
            "--output-json",
            str(out2),
        ]
    )
    assert code == 0
    s2 = json.loads(out2.read_text())["summary"]
    assert s2["completed"] == 3 and s2["output_tokens"] == 9
