"""`skiff serve` on the Qwen3-0.6B shape (random weights, --load-format dummy), driven by `skiff bench serve`
at several Poisson request rates (token-id prompts, --random-input-len 1024, --random-output-len 256,
--random-range-ratio 0.25, EOS ignored; `inf` sends all at once: the saturating rate), next to the engine's
offline rate on the same lengths (`skiff bench offline` in its own process, first, so the server gets the
GPU alone). The load generator runs as --num-clients processes and says when it was the limit.

The served vocabulary is cut to the tokenizer's (the embedded SmolLM2 one unless --tokenizer names another):
ids outside it would decode to "" and whole streams would come back empty.

--router runs every rate through `skiff-router` too, right after the direct run of that rate (saturating
rate first, so a time budget, --budget, drops the least telling runs). --api-workers, --detokenizer-workers
and --router-workers set the process counts. --ceiling-streams first measures the serving layer's own
ceiling (serving_ceiling.py: the null engine, direct and through the router, for each --ceiling-sets).

    python3 benchmarks/gpu_serve.py [--cpu] [--rates 8,24,64,inf] [--prompts 400] [--num-clients 4] [--tokenizer DIR]
        [--router] [--api-workers N] [--detokenizer-workers N] [--router-workers N]
        [--ceiling-streams 1,64,512 --ceiling-sets 1:1:1:1 4:2:4:2 --ceiling-num-clients 12] [--budget 520]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import Bench, config_only_dir, out_dir, require_modules, script_args

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


@dataclass(frozen=True)
class ServeOptions:
    router: bool = False  # every rate through skiff-router too
    api_workers: int = 1
    detokenizer_workers: int = 1
    router_workers: int = 1
    budget_s: float | None = None  # seconds after the script's start past which runs are skipped


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
    url: str, tokenizer: str, prompts: int, rate: float, cpu: bool, clients: int, label: str = ""
) -> dict[str, Any]:
    res = out_dir() / f"serve_rate_{rate:g}{label}.json"
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


def start_router(backend_url: str, workers: int, model: str) -> tuple[Any, str]:
    import yaml
    from servers import free_port, start, wait_healthy

    static = out_dir() / "serve_routes.yaml"
    route = {"name": "serve-svc", "models": [model], "endpoints": [backend_url.removeprefix("http://")]}
    static.write_text(yaml.safe_dump({"services": [route]}))
    port = free_port()
    argv = [
        "--static",
        str(static),
        "--host",
        "127.0.0.1",
        "--log-level",
        "warning",
        "--workers",
        str(workers),
    ]
    proc = start(argv, port, out_dir() / "serve_router.log", module="skiff_router.main")
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, 120)
    return proc, url


def served_model(bench: Bench, tokenizer: str | None) -> tuple[str, Path]:
    """The tokenizer (default: the embedded one) and a Qwen3-0.6B config whose vocabulary is cut to it: ids
    outside it would decode to "" and whole streams would come back empty."""
    from skiff.embedded import embedded_model_path
    from skiff.tokenizer import load_tokenizer

    tok = tokenizer or str(embedded_model_path())
    return tok, config_only_dir("qwen3_0_6b", bench, vocab_size=len(load_tokenizer(tok)))


def serve_section(
    bench: Bench,
    rates: list[float],
    prompts: int,
    tokenizer: str | None,
    clients: int = 4,
    options: ServeOptions | None = None,
) -> dict[str, Any]:
    import httpx  # the serving stack's dependencies: imported only when this section runs
    from servers import free_port, start, stop, wait_healthy

    opts = options or ServeOptions()
    tok, path = served_model(bench, tokenizer)
    args = ["serve", "--model", str(path), "--load-format", "dummy", "--tokenizer", tok, "--log-level"]
    args += ["warning", "--context-length", "4096", "--served-model-name", "qwen3"]
    args += ["--api-workers", str(opts.api_workers), "--detokenizer-workers", str(opts.detokenizer_workers)]
    if bench.cpu:
        args += ["--device", "cpu", "--max-total-tokens", "20000"]
        rates, prompts = [2.0], 6
    out: dict[str, Any] = {"command": " ".join(args), "options": opts.__dict__, "runs": {}, "router_runs": {}}
    out["offline"] = bench_offline(str(path), prompts, bench.cpu)
    port = free_port()
    server = start(args, port, out_dir() / "serve_server.log")
    url = f"http://127.0.0.1:{port}"
    router = None
    try:
        out["startup_s"] = round(wait_healthy(url, server, 300), 1)
        if opts.router:
            router, router_url = start_router(url, opts.router_workers, "qwen3")
        for rate in sorted(rates, reverse=True):  # the saturating rate first
            runs = [("runs", url, "")] + ([("router_runs", router_url, "_router")] if router else [])
            for key, base, label in runs:
                if opts.budget_s is not None and bench.elapsed() > opts.budget_s:
                    out[key][str(rate)] = {"error": f"skipped: time budget {opts.budget_s:.0f} s spent"}
                    continue
                out[key][str(rate)] = bench_serve(base, tok, prompts, rate, bench.cpu, clients, label)
                bench.results["serve_partial"] = out
                bench.save()
        metrics = httpx.get(url + "/metrics", timeout=10).text.splitlines()
        wanted = ("sglang:num_running", "sglang:cache_hit", "sglang:token_usage", "sglang:num_requests")
        out["metrics_tail"] = [line for line in metrics if line.startswith(wanted)]
        return out
    finally:
        stop([p for p in (router, server) if p is not None])
        out["server_exit"] = server.returncode
        bench.results.pop("serve_partial", None)


def ceiling_section(
    bench: Bench, streams: list[int], sets: list[str], clients: int, tokenizer: str | None
) -> dict[str, Any]:
    """serving_ceiling.py's measurement: the null engine, direct and through the router, per worker set."""
    import serving_ceiling as sc

    tok, model = served_model(bench, tokenizer)
    ap = argparse.ArgumentParser()
    sc.add_arguments(ap)
    argv = ["--router", "--num-clients", str(clients), "--probe-output-len", "4", "--streams"]
    argv += [str(s) for s in streams] + ["--sets", *sets]
    argv += ["--model", str(model), "--tokenizer", tok]
    if bench.cpu:
        argv += ["--output-len", "32", "--output-len-512", "16", "--rounds", "1"]
    ns = ap.parse_args(argv)
    ns.serve_args = []
    t0 = time.perf_counter()
    out = sc.run(ns)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def print_ceiling(ceiling: dict[str, Any]) -> None:
    for ws in ceiling.get("sets") or []:
        for d, r in zip(ws["direct"], ws["router"] or [None] * len(ws["direct"]), strict=False):
            line = (
                f"null engine {ws['set']} (api:detok:router:tok) {d['streams']} streams x {d['output_len']}: "
                f"direct {d['output_tok_s']:.0f} tok/s"
            )
            if r is not None:
                line += (
                    f", router {r['output_tok_s']:.0f} tok/s ({-r['loss_vs_direct_pct']:+.1f} % vs direct, "
                    f"{r['router_cpu_ms_per_request']:.2f} ms CPU/request)"
                )
            if d["client_saturated"] or (r and r["client_saturated"]):
                line += " (client saturated)"
            print(line)
    if ceiling.get("error"):
        print("ceiling", ceiling["error"])


def print_serve(serve: dict[str, Any]) -> None:
    offline = (serve.get("offline") or {}).get("output_throughput")
    if offline:
        print(f"offline, same lengths: {offline:.0f} output tok/s")
    direct = serve.get("runs") or {}
    for label, runs in (("serve", direct), ("router", serve.get("router_runs") or {})):
        for rate, r in runs.items():
            print_rate(label, rate, r, offline, direct.get(rate))
    if serve.get("error"):
        print("serve", serve["error"])


def print_rate(
    label: str, rate: str, r: dict[str, Any], offline: float | None, direct: dict[str, Any] | None
) -> None:
    if "error" in r:
        print(f"{label} rate {rate}: {r['error']}")
        return
    vs = ""
    if label == "router" and direct and direct.get("output_throughput"):
        vs = f", {100 * (r['output_throughput'] / direct['output_throughput'] - 1):+.1f} % vs direct"
    print(
        f"{label} rate {rate} req/s: {r['completed']} done, {r['request_throughput']:.1f} req/s, "
        f"out {r['output_throughput']:.0f} tok/s, "
        f"TTFT p50/p99 {r['ttft_ms']['p50']:.0f}/{r['ttft_ms']['p99']:.0f} ms, "
        f"TPOT p50/p99 {r['tpot_ms']['p50']:.1f}/{r['tpot_ms']['p99']:.1f} ms"
        + (f", {100 * r['output_throughput'] / offline:.0f} % of offline" if offline else "")
        + vs
        + (" (client saturated)" if r.get("client_saturated") else "")
    )


def rate_list(value: str) -> list[float]:
    return [float(x) for x in value.split(",")]


def main() -> None:
    def add(ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--rates", type=rate_list, default=[8.0, 24.0, 64.0, float("inf")])
        ap.add_argument("--prompts", type=int, default=400)
        ap.add_argument("--tokenizer", default=None)
        ap.add_argument("--num-clients", type=int, default=4)
        ap.add_argument("--router", action="store_true")
        ap.add_argument("--api-workers", type=int, default=1)
        ap.add_argument("--detokenizer-workers", type=int, default=1)
        ap.add_argument("--router-workers", type=int, default=1)
        ap.add_argument("--ceiling-streams", type=lambda v: [int(x) for x in v.split(",")], default=[])
        ap.add_argument(
            "--ceiling-sets", nargs="+", default=["1:1:1"], help="API:DETOKENIZERS:ROUTER:TOKENIZERS"
        )
        ap.add_argument("--ceiling-num-clients", type=int, default=8)
        ap.add_argument("--budget", type=float, default=None, help="seconds; later serve runs are skipped")

    bench, args = script_args(__doc__, add)
    require_modules("skiff.server.launcher", "skiff_router.main")
    opts = ServeOptions(
        args.router, args.api_workers, args.detokenizer_workers, args.router_workers, args.budget
    )
    if args.ceiling_streams:
        ceiling = (args.ceiling_streams, args.ceiling_sets, args.ceiling_num_clients, args.tokenizer)
        bench.section("ceiling", ceiling_section, bench, *ceiling)
    bench.section(
        "serve", serve_section, bench, args.rates, args.prompts, args.tokenizer, args.num_clients, opts
    )
    if args.ceiling_streams:
        print_ceiling(bench.results["ceiling"])
    print_serve(bench.results["serve"])


if __name__ == "__main__":
    main()
