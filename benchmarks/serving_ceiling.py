"""The serving layer's own ceiling: `skiff serve --null-engine` (steps cost nothing) under streamed load.

For each set of process counts (--sets API:DETOKENIZERS:ROUTER:TOKENIZERS, e.g. `1:1:1:1 4:2:4:2`) and
each number of concurrent streams it reports streamed output tokens/s, requests/s, TTFT and ITL, the load generator's
saturation check, and CPU milliseconds per 1,000 tokens by role (API server, detokenizer, scheduler,
tokenizer; the router's own per 1,000 tokens and per request). With --router the same loads go through
`skiff-router` too, and the router's overhead is the throughput lost against the direct run.
`--probe-output-len 4` adds a short-output run at 64 streams: the router's cost per request alone.

    python benchmarks/serving_ceiling.py --streams 1 64 512 --num-clients 8 --router --sets 1:1:1:1 4:2:4:2
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from servers import cpu_seconds_by_name, free_port, start, stop, wait_healthy
from skiff.bench.load_clients import run_clients, saturation_note
from skiff.bench.serve_client import ServeTarget, summarize
from skiff.bench.workloads import PromptMaker, random_workload

ROLES = (("skiff-api", "api"), ("skiff-detok", "detokenizer"), ("skiff-sched", "scheduler"))
ROLES += (("skiff-tokeni", "tokenizer"), ("skiff-router", "router"))


@dataclass(frozen=True)
class WorkerSet:
    api: int = 1
    detokenizers: int = 1
    router: int = 1
    tokenizers: int = 1

    @classmethod
    def parse(cls, text: str) -> WorkerSet:
        parts = [int(p) for p in text.split(":")]
        if not 1 <= len(parts) <= 4 or min(parts) < 1:
            raise argparse.ArgumentTypeError(
                f"a set is API[:DETOKENIZERS[:ROUTER[:TOKENIZERS]]] processes >= 1, not {text!r}"
            )
        return cls(*parts)

    @property
    def name(self) -> str:
        return f"{self.api}:{self.detokenizers}:{self.router}:{self.tokenizers}"


@dataclass
class Service:
    proc: subprocess.Popen
    url: str


def start_server(args: argparse.Namespace, ws: WorkerSet, work: Path) -> Service:
    port = free_port()
    argv = ["serve", "--null-engine", "--host", "127.0.0.1", "--served-model-name", "null"]
    argv += ["--max-running-requests", str(max(args.streams) * 2), "--log-level", "warning"]
    argv += ["--api-workers", str(ws.api), "--detokenizer-workers", str(ws.detokenizers)]
    argv += ["--num-tokenizers", str(ws.tokenizers)]
    if args.model:
        argv += ["--model", args.model]
    if args.tokenizer:
        argv += ["--tokenizer", args.tokenizer]
    proc = start(argv + args.serve_args, port, work / f"server-{ws.name}.log")
    server = Service(proc, f"http://127.0.0.1:{port}")
    wait_healthy(server.url, server.proc, 600)
    return server


def start_router(backend: Service, ws: WorkerSet, work: Path) -> Service:
    port = free_port()
    static = work / "routes.yaml"
    route = {"name": "null-svc", "models": ["null"], "endpoints": [backend.url.removeprefix("http://")]}
    static.write_text(yaml.safe_dump({"services": [route]}))
    argv = ["--static", str(static), "--host", "127.0.0.1", "--log-level", "warning"]
    argv += ["--workers", str(ws.router)]
    proc = start(argv, port, work / f"router-{ws.name}.log", module="skiff_router.main")
    router = Service(proc, f"http://127.0.0.1:{port}")
    wait_healthy(router.url, router.proc, 120)
    deadline = time.monotonic() + 30  # the route is read from the file shortly after start
    while (
        time.monotonic() < deadline and '"null"' not in httpx.get(router.url + "/v1/models", timeout=5).text
    ):
        time.sleep(0.2)
    return router


def cpu_by_role(pid: int) -> dict[str, float]:
    """CPU seconds of a process tree by role (the first process of each is named after its interpreter)."""
    out: dict[str, float] = defaultdict(float)
    for name, seconds in cpu_seconds_by_name(pid).items():
        role = next((r for prefix, r in ROLES if name.startswith(prefix)), "main")
        out[role] += seconds
    return dict(out)


def measure(
    url: str,
    server: Service,
    router: Service | None,
    streams: int,
    output_len: int,
    args: argparse.Namespace,
    tok: Any,
) -> dict[str, Any]:
    maker = PromptMaker(tok, random.Random(streams))
    num = max(args.min_requests, streams * args.rounds)
    reqs = random_workload(maker, num, args.input_len, output_len, 1.0, as_ids=False)
    target = ServeTarget(url + "/v1", "null", "completions", None, ignore_eos=True, temperature=0.0)
    clients = max(1, min(args.num_clients, streams))
    before = cpu_by_role(server.proc.pid)
    before_router = cpu_by_role(router.proc.pid) if router else {}
    results, duration, reports = run_clients(
        target, reqs, float("inf"), streams, seed=0, num_clients=clients, progress=False
    )
    after = cpu_by_role(server.proc.pid)
    after_router = cpu_by_role(router.proc.pid) if router else {}
    s = summarize(results, duration)
    per_k = 1000.0 / max(1, s["output_tokens"])
    cpu = {role: round(1000 * (after[role] - before.get(role, 0.0)) * per_k, 2) for role in after}
    cpu["api"] = round(cpu.get("api", 0.0) + cpu.pop("main", 0.0), 2)  # worker 0 is the main process
    out = {
        "streams": streams,
        "output_len": output_len,
        "requests": num,
        "completed": s["completed"],
        "failed": s["failed"],
        "errors": s["errors"],
        "output_tok_s": round(s["output_throughput"], 1),
        "req_s": round(s["request_throughput"], 2),
        "ttft_p50_ms": round(s["ttft_ms"]["p50"], 1),
        "ttft_p99_ms": round(s["ttft_ms"]["p99"], 1),
        "itl_p99_ms": round(s["itl_ms"]["p99"], 2),
        "server_cpu_ms_per_1k_tokens": cpu,
        "num_clients": clients,
        "client_saturated": saturation_note(reports) is not None,
        "clients": [
            {"cpu_share": round(c.cpu_share, 2), "lag_p99_ms": round(c.loop_lag_p99_ms, 1)} for c in reports
        ],
    }
    if router is not None:
        spent = sum(after_router.values()) - sum(before_router.values())
        out["router_cpu_ms_per_1k_tokens"] = round(1000 * spent * per_k, 2)
        out["router_cpu_ms_per_request"] = round(1000 * spent / max(1, s["completed"]), 3)
    return out


def row(name: str, r: dict[str, Any]) -> str:
    sat = " (client saturated)" if r["client_saturated"] else ""
    cpu = " ".join(f"{k} {v:.1f}" for k, v in sorted(r["server_cpu_ms_per_1k_tokens"].items()))
    extra = (
        f"  router {r['router_cpu_ms_per_1k_tokens']:.1f} ms/1k" if "router_cpu_ms_per_1k_tokens" in r else ""
    )
    return (
        f"{name:14s} {r['streams']:4d} streams x {r['output_len']:3d}: {r['output_tok_s']:9.1f} tok/s "
        f"{r['req_s']:7.2f} req/s  TTFT p50/p99 {r['ttft_p50_ms']:.0f}/{r['ttft_p99_ms']:.0f} ms  "
        f"ITL p99 {r['itl_p99_ms']:.1f} ms  failed {r['failed']}  {r['num_clients']} clients{sat}  "
        f"server ms/1k: {cpu}{extra}"
    )


def run_set(args: argparse.Namespace, ws: WorkerSet, tok: Any, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"set": ws.name, "direct": [], "router": []}
    server = start_server(args, ws, work)
    router = start_router(server, ws, work) if args.router else None
    loads = [(s, args.output_len if s < 512 else args.output_len_512) for s in args.streams]
    if args.probe_output_len:
        loads.append((64, args.probe_output_len))
    try:
        for streams, output_len in loads:
            out["direct"].append(measure(server.url, server, None, streams, output_len, args, tok))
            print(row(f"{ws.name} direct", out["direct"][-1]), flush=True)
            if router is not None:
                out["router"].append(measure(router.url, server, router, streams, output_len, args, tok))
                print(row(f"{ws.name} router", out["router"][-1]), flush=True)
    finally:
        stop([p.proc for p in (router, server) if p is not None])
    for d, r in zip(out["direct"], out["router"], strict=False):
        loss = 100 * (1 - r["output_tok_s"] / d["output_tok_s"]) if d["output_tok_s"] else 0.0
        r["loss_vs_direct_pct"] = round(loss, 1)
        r["added_ttft_p50_ms"] = round(r["ttft_p50_ms"] - d["ttft_p50_ms"], 1)
        print(
            f"{ws.name} router at {d['streams']} streams x {d['output_len']}: {-loss:+.1f} % vs direct, "
            f"TTFT p50 +{r['added_ttft_p50_ms']:.1f} ms, {r['router_cpu_ms_per_request']:.2f} ms CPU per "
            f"request, {r['router_cpu_ms_per_1k_tokens']:.1f} ms per 1k tokens",
            flush=True,
        )
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2 (its config and tokenizer)")
    ap.add_argument("--tokenizer", default=None, help="default: the model's")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 64, 512])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--output-len-512", type=int, default=128, help="output tokens at >= 512 streams")
    ap.add_argument("--probe-output-len", type=int, default=0, help="also 64 streams of this many tokens")
    ap.add_argument("--rounds", type=int, default=2, help="requests per stream")
    ap.add_argument("--min-requests", type=int, default=8)
    ap.add_argument(
        "--num-clients", type=int, default=2, help="load-generator processes (at most 1 per stream)"
    )
    ap.add_argument("--router", action="store_true", help="also through skiff-router")
    ap.add_argument(
        "--sets",
        type=WorkerSet.parse,
        nargs="+",
        default=[WorkerSet()],
        help="API:DETOKENIZERS:ROUTER:TOKENIZERS processes",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    from skiff.embedded import embedded_model_path
    from skiff.tokenizer import load_tokenizer

    tok = load_tokenizer(args.tokenizer or args.model or embedded_model_path())
    with tempfile.TemporaryDirectory() as tmp:
        return {"sets": [run_set(args, ws, tok, Path(tmp)) for ws in args.sets]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    ap.add_argument("--output-json", default=None)
    ap.add_argument("serve_args", nargs="*", help="after --: more `skiff serve` flags")
    args = ap.parse_args()
    out = run(args)
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
