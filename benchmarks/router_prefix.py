"""Router benchmark: `skiff bench serve` (shared-prefix workload) through `skiff-router` over N CPU
`skiff serve` backends, comparing routing strategies on throughput, time to first token and backend
prefix-cache hit rate.

    python benchmarks/router_prefix.py --backends 3 --groups 6 --prompts 36 --concurrency 6

`skiff bench serve --dataset shared-prefix` sends `--groups` long shared prefixes, each request adding its own
short suffix, so a backend that served a group before has its prefix in the radix cache. Each strategy gets
fresh prefixes (its own `--seed`): caches warmed by an earlier strategy do not help a later one. The cache hit
rate is read from the backends' `sglang:cached_tokens_total` / `sglang:prompt_tokens_total` before and after.
Not a test: numbers only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from servers import free_port, metric, start, stop, wait_healthy


def bench_serve(router: str, seed: int, a: argparse.Namespace, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "skiff.cli",
        "bench",
        "serve",
        "--base-url",
        router + "/v1",
        "--model",
        "smol",
        "--dataset",
        "shared-prefix",
        "--num-prompts",
        str(a.prompts),
        "--shared-prefix-groups",
        str(a.groups),
        "--shared-prefix-len",
        str(a.prefix_len),
        "--shared-suffix-len",
        str(a.suffix_len),
        "--random-output-len",
        str(a.max_tokens),
        "--max-concurrency",
        str(a.concurrency),
        "--seed",
        str(seed),
        "--warmup-requests",
        "0",
        "--no-progress",
        "--output-json",
        str(out),
    ]
    subprocess.run(cmd, check=True, timeout=3600)
    return json.loads(out.read_text())["summary"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", type=int, default=3)
    p.add_argument("--groups", type=int, default=6, help="shared prefixes")
    p.add_argument("--prompts", type=int, default=36)
    p.add_argument("--concurrency", type=int, default=6)
    p.add_argument("--prefix-len", type=int, default=384, help="shared prefix tokens")
    p.add_argument("--suffix-len", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--strategies", default="roundRobin,leastRequests,prefixHash")
    p.add_argument("--threads", type=int, default=1, help="torch threads per backend")
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="skiff-router-bench-"))
    procs: list[subprocess.Popen] = []
    try:
        backends = []
        for i in range(a.backends):
            port = free_port()
            procs.append(
                start(
                    [
                        "serve",
                        "--served-model-name",
                        "smol",
                        "--host",
                        "127.0.0.1",
                        "--log-level",
                        "warning",
                        "--cpu-kv-cache-gb",
                        "0.5",
                        "--num-tokenizers",
                        "1",
                        "--num-threads",
                        str(a.threads),
                    ],
                    port,
                    tmp / f"serve{i}.log",
                )
            )
            backends.append(f"127.0.0.1:{port}")
        discovery = tmp / "discovery.yaml"

        def route(strategy: str) -> None:
            discovery.write_text(
                yaml.safe_dump(
                    {
                        "services": [
                            {
                                "name": "smol",
                                "models": ["smol"],
                                "endpoints": backends,
                                "strategy": strategy,
                                "prefixChars": 160,
                            }
                        ]
                    }
                )
            )
            time.sleep(1.0)

        route("roundRobin")
        router_port = free_port()
        procs.append(
            start(
                [
                    "--static",
                    str(discovery),
                    "--host",
                    "127.0.0.1",
                    "--log-level",
                    "warning",
                    "--refresh-interval",
                    "0.2",
                ],
                router_port,
                tmp / "router.log",
                module="skiff_router.main",
            )
        )
        router = f"http://127.0.0.1:{router_port}"
        for proc, b in zip(procs, backends + [router.removeprefix("http://")], strict=True):
            wait_healthy(f"http://{b}", proc, 600)
        bench_serve(
            router,
            999,
            argparse.Namespace(**{**vars(a), "prompts": a.backends, "groups": a.backends}),
            tmp / "warmup.json",
        )
        rows = []
        for seed, strategy in enumerate(a.strategies.split(",")):
            route(strategy)
            before = [
                (
                    metric(f"http://{b}", "sglang:cached_tokens_total"),
                    metric(f"http://{b}", "sglang:prompt_tokens_total"),
                )
                for b in backends
            ]
            summ = bench_serve(router, seed, a, tmp / f"{strategy}.json")
            after = [
                (
                    metric(f"http://{b}", "sglang:cached_tokens_total"),
                    metric(f"http://{b}", "sglang:prompt_tokens_total"),
                )
                for b in backends
            ]
            cached = sum(x[0] - y[0] for x, y in zip(after, before, strict=True))
            prompt = sum(x[1] - y[1] for x, y in zip(after, before, strict=True))
            rows.append(
                {
                    "strategy": strategy,
                    "requests": summ["completed"],
                    "failed": summ["failed"],
                    "wall_s": round(summ["duration_s"], 2),
                    "req_per_s": round(summ["request_throughput"], 3),
                    "output_tok_per_s": round(summ["output_throughput"], 2),
                    "ttft_mean_s": round(summ["ttft_ms"]["mean"] / 1e3, 3),
                    "ttft_p50_s": round(summ["ttft_ms"]["p50"] / 1e3, 3),
                    "ttft_p90_s": round(summ["ttft_ms"]["p90"] / 1e3, 3),
                    "cache_hit_rate": round(cached / prompt, 3) if prompt else 0.0,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
        print(
            "\n| strategy | req/s | output tok/s | TTFT mean (s) | TTFT p50 (s) | TTFT p90 (s) | cache hit rate |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['strategy']} | {r['req_per_s']} | {r['output_tok_per_s']} | {r['ttft_mean_s']} | "
                f"{r['ttft_p50_s']} | {r['ttft_p90_s']} | {r['cache_hit_rate']} |"
            )
        if a.json:
            Path(a.json).write_text(json.dumps({"config": vars(a), "results": rows}, indent=2))
        return 0
    finally:
        stop(procs)


if __name__ == "__main__":
    sys.exit(main())
