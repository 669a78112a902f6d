"""Router benchmark: a shared-prefix chat workload through `skiff router` over N CPU `skiff serve` backends,
comparing routing strategies on throughput, time to first token and backend prefix-cache hit rate.

    python benchmarks/router_prefix.py --backends 3 --tenants 6 --requests-per-tenant 6 --concurrency 6

Each tenant has its own long system prompt; its requests differ only in the final question, so a backend
that served the tenant before has the prefix in its radix cache. For each strategy the workload uses fresh
tenant prompts (caches warmed by an earlier strategy do not help a later one). Not a test: numbers only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

TOPICS = ["parcel tracking", "customs forms", "delivery windows", "returns", "insurance claims", "pallets",
          "hazardous goods", "address changes", "lost items", "signatures"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], port: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "skiff.cli", *args, "--port", str(port)],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(url)


def metric(url: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        series, _, value = line.rpartition(" ")
        if series.split("{")[0] == name:
            total += float(value)
    return total


def system_prompt(tag: str, tenant: int, words: int) -> str:
    rng = random.Random(f"{tag}-{tenant}")
    body = " ".join(rng.choice(TOPICS).replace(" ", "-") for _ in range(words))
    return f"Tenant {tag}-{tenant}. You are the support assistant of a shipping company. Topics: {body}."


async def one(client: httpx.AsyncClient, url: str, model: str, system: str, question: str, max_tokens: int) -> dict:
    start = time.perf_counter()
    ttft = None
    tokens = 0
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                ttft = ttft if ttft is not None else time.perf_counter() - start
                tokens += 1
    return {"ttft": ttft if ttft is not None else time.perf_counter() - start,
            "latency": time.perf_counter() - start, "tokens": tokens}


async def workload(url: str, model: str, tag: str, a: argparse.Namespace) -> tuple[list[dict], float]:
    jobs = [(system_prompt(tag, t, a.prompt_words), f"Question {q}: how long does it take?")
            for q in range(a.requests_per_tenant) for t in range(a.tenants)]
    # arrival order shuffled (seeded): a fixed tenant cycle would line up with round robin's cycle
    random.Random(f"order-{tag}").shuffle(jobs)
    sem = asyncio.Semaphore(a.concurrency)
    async with httpx.AsyncClient(timeout=600) as client:
        async def run(job):
            async with sem:
                return await one(client, url, model, *job, a.max_tokens)

        t0 = time.perf_counter()
        results = await asyncio.gather(*(run(j) for j in jobs))
        return list(results), time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", type=int, default=3)
    p.add_argument("--tenants", type=int, default=6)
    p.add_argument("--requests-per-tenant", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=6)
    p.add_argument("--prompt-words", type=int, default=120, help="system prompt length (words)")
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
            procs.append(start(["serve", "--served-model-name", "smol", "--host", "127.0.0.1", "--log-level",
                                "warning", "--cpu-kv-cache-gb", "0.5", "--num-tokenizers", "1",
                                "--num-threads", str(a.threads)], port, tmp / f"serve{i}.log"))
            backends.append(f"127.0.0.1:{port}")
        discovery = tmp / "discovery.yaml"

        def route(strategy: str) -> None:
            discovery.write_text(yaml.safe_dump({"services": [
                {"name": "smol", "models": ["smol"], "endpoints": backends, "strategy": strategy,
                 "prefixChars": 160}]}))
            time.sleep(1.0)

        route("roundRobin")
        router_port = free_port()
        procs.append(start(["router", "--static", str(discovery), "--host", "127.0.0.1", "--log-level", "warning",
                            "--refresh-interval", "0.2"], router_port, tmp / "router.log"))
        router = f"http://127.0.0.1:{router_port}"
        for proc, b in zip(procs, backends + [router.removeprefix("http://")], strict=True):
            wait_healthy(f"http://{b}", proc, 600)
        asyncio.run(workload(router, "smol", "warmup", argparse.Namespace(**{**vars(a), "tenants": a.backends,
                                                                               "requests_per_tenant": 1})))
        rows = []
        for strategy in a.strategies.split(","):
            route(strategy)
            before = [(metric(f"http://{b}", "sglang:cached_tokens_total"),
                       metric(f"http://{b}", "sglang:prompt_tokens_total")) for b in backends]
            results, wall = asyncio.run(workload(router, "smol", strategy, a))
            after = [(metric(f"http://{b}", "sglang:cached_tokens_total"),
                      metric(f"http://{b}", "sglang:prompt_tokens_total")) for b in backends]
            cached = sum(x[0] - y[0] for x, y in zip(after, before, strict=True))
            prompt = sum(x[1] - y[1] for x, y in zip(after, before, strict=True))
            ttfts = sorted(r["ttft"] for r in results)
            rows.append({
                "strategy": strategy, "requests": len(results), "wall_s": round(wall, 2),
                "req_per_s": round(len(results) / wall, 3),
                "output_tok_per_s": round(sum(r["tokens"] for r in results) / wall, 2),
                "ttft_mean_s": round(statistics.mean(ttfts), 3),
                "ttft_p50_s": round(ttfts[len(ttfts) // 2], 3),
                "ttft_p90_s": round(ttfts[int(len(ttfts) * 0.9)], 3),
                "cache_hit_rate": round(cached / prompt, 3) if prompt else 0.0,
            })
            print(json.dumps(rows[-1]), flush=True)
        print("\n| strategy | req/s | output tok/s | TTFT mean (s) | TTFT p50 (s) | TTFT p90 (s) | cache hit rate |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['strategy']} | {r['req_per_s']} | {r['output_tok_per_s']} | {r['ttft_mean_s']} | "
                  f"{r['ttft_p50_s']} | {r['ttft_p90_s']} | {r['cache_hit_rate']} |")
        if a.json:
            Path(a.json).write_text(json.dumps({"config": vars(a), "results": rows}, indent=2))
        return 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
