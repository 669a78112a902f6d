"""`skiff serve` on the Qwen3-0.6B shape (random weights, --load-format dummy), driven by `skiff bench serve`
at several Poisson request rates (token-id prompts, --random-input-len 1024, --random-output-len 256,
--random-range-ratio 0.25, EOS ignored; `inf` sends all at once: the saturating rate), next to the engine's
offline rate on the same lengths (`skiff bench offline` in its own process, first, so the server gets the
GPU alone). The load generator runs as --num-clients processes and says when it was the limit.

The served vocabulary is cut to the tokenizer's (the embedded SmolLM2 one unless --tokenizer names another):
ids outside it would decode to "" and whole streams would come back empty.

    python3 benchmarks/gpu_serve.py [--cpu] [--rates 8,24,64,inf] [--prompts 400] [--num-clients 4] [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from harness import Bench, config_only_dir, out_dir, script_args

SUMMARY_KEYS = (
    "completed",
    "failed",
    "duration_s",
    "request_throughput",
    "output_throughput",
    "input_throughput",
    "ttft_ms",
    "tpot_ms",
    "itl_ms",
    "e2e_ms",
    "client_saturated",
)


def lengths(cpu: bool) -> tuple[int, int]:
    return (32, 8) if cpu else (1024, 256)


def bench_offline(model: str, prompts: int, cpu: bool) -> dict[str, Any]:
    """The engine alone on the serve runs' length distribution (uniform in [len / 4, len])."""
    res = out_dir() / "offline_same_lengths.json"
    n_in, n_out = lengths(cpu)
    cmd = [sys.executable, "-m", "skiff.cli", "bench", "offline", "--model", model, "--load-format", "dummy"]
    cmd += ["--num-seqs", str(prompts), "--min-input-len", str(n_in // 4), "--max-input-len", str(n_in)]
    cmd += ["--min-output-len", str(n_out // 4), "--max-output-len", str(n_out), "--context-length", "4096"]
    cmd += ["--output-json", str(res)] + (["--device", "cpu", "--max-total-tokens", "20000"] if cpu else [])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    print(done.stdout[-600:], done.stderr[-600:], flush=True)
    if done.returncode != 0 or not res.is_file():
        return {"error": f"rc={done.returncode}", "stderr": done.stderr[-800:]}
    r = json.loads(res.read_text())
    return {k: r.get(k) for k in ("output_tokens", "wall_seconds", "output_throughput", "total_throughput")}


def bench_serve(
    url: str, tokenizer: str, prompts: int, rate: float, cpu: bool, clients: int
) -> dict[str, Any]:
    res = out_dir() / f"serve_rate_{rate:g}.json"
    n_in, n_out = lengths(cpu)
    cmd = [sys.executable, "-m", "skiff.cli", "bench", "serve", "--base-url", url + "/v1", "--tokenizer"]
    cmd += [tokenizer, "--prompt-ids", "--num-prompts", str(prompts), "--request-rate", str(rate)]
    cmd += ["--random-input-len", str(n_in), "--random-output-len", str(n_out), "--num-clients", str(clients)]
    cmd += [
        "--random-range-ratio",
        "0.25",
        "--warmup-requests",
        "4",
        "--no-progress",
        "--output-json",
        str(res),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    print(done.stdout[-1500:], done.stderr[-800:], flush=True)
    if done.returncode != 0 or not res.is_file():
        return {"error": f"rc={done.returncode}", "stderr": done.stderr[-800:]}
    summary = json.loads(res.read_text())["summary"]
    return {k: summary.get(k) for k in SUMMARY_KEYS}


def serve_section(
    bench: Bench, rates: list[float], prompts: int, tokenizer: str | None, clients: int = 4
) -> dict[str, Any]:
    import httpx  # the serving stack's dependencies: imported only when this section runs
    from servers import free_port, start, stop, wait_healthy
    from skiff.embedded import embedded_model_path
    from skiff.tokenizer import load_tokenizer

    tok = tokenizer or str(embedded_model_path())
    path = config_only_dir("qwen3_0_6b", bench, vocab_size=len(load_tokenizer(tok)))
    args = ["serve", "--model", str(path), "--load-format", "dummy", "--tokenizer", tok, "--log-level"]
    args += ["warning", "--context-length", "4096"]
    if bench.cpu:
        args += ["--device", "cpu", "--max-total-tokens", "20000"]
        rates, prompts = [2.0], 6
    out: dict[str, Any] = {"command": " ".join(args), "runs": {}}
    out["offline"] = bench_offline(str(path), prompts, bench.cpu)
    port = free_port()
    server = start(args, port, out_dir() / "serve_server.log")
    url = f"http://127.0.0.1:{port}"
    try:
        out["startup_s"] = round(wait_healthy(url, server, 300), 1)
        for rate in rates:
            out["runs"][str(rate)] = bench_serve(url, tok, prompts, rate, bench.cpu, clients)
        metrics = httpx.get(url + "/metrics", timeout=10).text.splitlines()
        wanted = ("sglang:num_running", "sglang:cache_hit", "sglang:token_usage")
        out["metrics_tail"] = [line for line in metrics if line.startswith(wanted)]
        return out
    finally:
        stop([server])
        out["server_exit"] = server.returncode


def print_serve(serve: dict[str, Any]) -> None:
    offline = (serve.get("offline") or {}).get("output_throughput")
    if offline:
        print(f"offline, same lengths: {offline:.0f} output tok/s")
    for rate, r in (serve.get("runs") or {}).items():
        if "error" in r:
            print(f"serve rate {rate}: {r['error']}")
            continue
        print(
            f"serve rate {rate} req/s: {r['completed']} done, {r['request_throughput']:.1f} req/s, "
            f"out {r['output_throughput']:.0f} tok/s, "
            f"TTFT p50/p99 {r['ttft_ms']['p50']:.0f}/{r['ttft_ms']['p99']:.0f} ms, "
            f"TPOT p50/p99 {r['tpot_ms']['p50']:.1f}/{r['tpot_ms']['p99']:.1f} ms"
            + (f", {100 * r['output_throughput'] / offline:.0f} % of offline" if offline else "")
            + (" (client saturated)" if r.get("client_saturated") else "")
        )
    if serve.get("error"):
        print("serve", serve["error"])


def rate_list(value: str) -> list[float]:
    return [float(x) for x in value.split(",")]


def main() -> None:
    def add(ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--rates", type=rate_list, default=[8.0, 24.0, 64.0, float("inf")])
        ap.add_argument("--prompts", type=int, default=400)
        ap.add_argument("--tokenizer", default=None)
        ap.add_argument("--num-clients", type=int, default=4)

    bench, args = script_args(__doc__, add)
    bench.section("serve", serve_section, bench, args.rates, args.prompts, args.tokenizer, args.num_clients)
    print_serve(bench.results["serve"])


if __name__ == "__main__":
    main()
