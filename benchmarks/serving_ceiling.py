"""The serving layer's own ceiling: `skiff serve --null-engine` (steps cost nothing) under streamed load.

For each number of concurrent streams it reports streamed output tokens/s, requests/s, TTFT and ITL, the
load generator's saturation check, and the server's CPU seconds per 1,000 tokens by process (API server,
tokenizer, detokenizer, scheduler). With --router, the same loads go through `skiff-router` too and the
router's overhead is the throughput lost against the direct run.

    python benchmarks/serving_ceiling.py --streams 1 64 512 --num-clients 2 --router
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from servers import cpu_seconds_by_name, free_port, start, stop, wait_healthy
from skiff.bench.load_clients import run_clients, saturation_note
from skiff.bench.serve_client import ServeTarget, summarize
from skiff.bench.workloads import PromptMaker, random_workload
from skiff.tokenizer import load_tokenizer


@dataclass
class Server:
    proc: subprocess.Popen
    url: str


def start_server(args: argparse.Namespace, work: Path) -> Server:
    port = free_port()
    argv = ["serve", "--null-engine", "--host", "127.0.0.1", "--served-model-name", "null"]
    argv += ["--max-running-requests", str(max(args.streams) * 2)]
    if args.model:
        argv += ["--model", args.model]
    if args.tokenizer:
        argv += ["--tokenizer", args.tokenizer]
    server = Server(start(argv + args.serve_args, port, work / "server.log"), f"http://127.0.0.1:{port}")
    wait_healthy(server.url, server.proc, 600)
    return server


def start_router(backend: Server, work: Path) -> Server:
    port = free_port()
    static = work / "routes.yaml"
    route = {"name": "null", "models": ["null"], "endpoints": [backend.url.removeprefix("http://")]}
    static.write_text(yaml.safe_dump({"services": [route]}))
    argv = ["--static", str(static), "--host", "127.0.0.1", "--log-level", "warning"]
    router = Server(
        start(argv, port, work / "router.log", module="skiff_router.main"), f"http://127.0.0.1:{port}"
    )
    wait_healthy(router.url, router.proc, 60)
    deadline = time.monotonic() + 30  # the route is read from the file shortly after start
    while time.monotonic() < deadline and "null" not in httpx.get(router.url + "/v1/models", timeout=5).text:
        time.sleep(0.2)
    return router


def measure(url: str, server: Server, streams: int, args: argparse.Namespace, tok: Any) -> dict[str, Any]:
    maker = PromptMaker(tok, random.Random(streams))
    num = max(args.min_requests, streams * args.rounds)
    reqs = random_workload(maker, num, args.input_len, args.output_len, 1.0, as_ids=False)
    target = ServeTarget(url + "/v1", "null", "completions", None, ignore_eos=True, temperature=0.0)
    before = cpu_seconds_by_name(server.proc.pid)
    results, duration, clients = run_clients(
        target, reqs, float("inf"), streams, seed=0, num_clients=args.num_clients, progress=False
    )
    after = cpu_seconds_by_name(server.proc.pid)
    s = summarize(results, duration)
    per_k = 1000.0 / max(1, s["output_tokens"])
    cpu = {name: round((after[name] - before.get(name, 0.0)) * per_k, 4) for name in after}
    note = saturation_note(clients)
    return {
        "streams": streams,
        "requests": num,
        "completed": s["completed"],
        "failed": s["failed"],
        "output_tok_s": round(s["output_throughput"], 1),
        "req_s": round(s["request_throughput"], 2),
        "ttft_p50_ms": round(s["ttft_ms"]["p50"], 1),
        "ttft_p99_ms": round(s["ttft_ms"]["p99"], 1),
        "itl_p99_ms": round(s["itl_ms"]["p99"], 2),
        "server_cpu_s_per_1k_tokens": cpu,
        "client_saturated": note is not None,
        "clients": [
            {"cpu_share": round(c.cpu_share, 2), "lag_p99_ms": round(c.loop_lag_p99_ms, 1)} for c in clients
        ],
    }


def row(name: str, r: dict[str, Any]) -> str:
    sat = " (client saturated)" if r["client_saturated"] else ""
    return (
        f"{name:7s} {r['streams']:4d} streams: {r['output_tok_s']:9.1f} tok/s {r['req_s']:7.2f} req/s  "
        f"TTFT p50/p99 {r['ttft_p50_ms']:.0f}/{r['ttft_p99_ms']:.0f} ms  ITL p99 {r['itl_p99_ms']:.1f} ms  "
        f"failed {r['failed']}{sat}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", default=None, help="default: the embedded SmolLM2 (only its config and tokenizer)"
    )
    ap.add_argument("--tokenizer", default=None, help="default: the model's")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 64, 512])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2, help="requests per stream")
    ap.add_argument("--min-requests", type=int, default=8)
    ap.add_argument("--num-clients", type=int, default=2)
    ap.add_argument("--router", action="store_true", help="also through skiff-router")
    ap.add_argument("--output-json", default=None)
    ap.add_argument("serve_args", nargs="*", help="after --: more `skiff serve` flags")
    args = ap.parse_args()
    from skiff.embedded import embedded_model_path

    tok = load_tokenizer(args.tokenizer or args.model or embedded_model_path())
    out: dict[str, Any] = {"direct": [], "router": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        server = start_server(args, work)
        router = start_router(server, work) if args.router else None
        try:
            for streams in args.streams:
                out["direct"].append(measure(server.url, server, streams, args, tok))
                print(row("direct", out["direct"][-1]), flush=True)
                if router is not None:
                    out["router"].append(measure(router.url, server, streams, args, tok))
                    print(row("router", out["router"][-1]), flush=True)
        finally:
            stop([p.proc for p in (router, server) if p is not None])
    for d, r in zip(out["direct"], out["router"], strict=False):
        print(
            f"router overhead at {d['streams']} streams: {100 * (1 - r['output_tok_s'] / d['output_tok_s']):.1f} %"
        )
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
