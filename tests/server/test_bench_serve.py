"""`skiff bench serve` against the live test server: counts, percentiles and JSON are real."""

from __future__ import annotations

import json
from pathlib import Path

from skiff.cli import main
from support.serve import ServerProcess


def bench_serve(server: ServerProcess, out: Path, *args: str) -> dict:
    """Runs `skiff bench serve` in this process; returns its JSON report."""
    base = ["bench", "serve", "--base-url", server.url + "/v1", "--api-key", server.api_key or ""]
    assert main([*base, *args, "--no-progress", "--output-json", str(out)]) == 0
    return json.loads(out.read_text())


def test_bench_serve_random_and_shared_prefix(server: ServerProcess, tmp_path: Path) -> None:
    random_args = ["--num-prompts", "4", "--random-input-len", "24", "--random-output-len", "5"]
    report = bench_serve(server, tmp_path / "bench.json", *random_args, "--max-concurrency", "2")
    s = report["summary"]
    assert s["completed"] == 4 and s["failed"] == 0
    assert s["output_tokens"] == 4 * 5  # EOS ignored: every request runs to max_tokens
    assert all(r["output_len"] == 5 and r["ttft"] > 0 for r in report["requests"])
    assert 0 < s["ttft_ms"]["p50"] <= s["ttft_ms"]["p99"]
    assert s["itl_ms"]["p50"] > 0 and s["output_throughput"] > 0

    prefix_args = [
        *("--api", "chat", "--dataset", "shared-prefix", "--shared-prefix-groups", "1"),
        *("--shared-prefix-len", "96", "--shared-suffix-len", "8"),
        *("--num-prompts", "3", "--random-output-len", "3", "--request-rate", "20"),
    ]
    s2 = bench_serve(server, tmp_path / "prefix.json", *prefix_args)["summary"]
    assert s2["completed"] == 3 and s2["output_tokens"] == 9
