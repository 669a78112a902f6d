"""`skiff bench serve`: a streaming load generator for any OpenAI-compatible server.

Requests go out at a Poisson rate (--request-rate) and/or under a concurrency cap (--max-concurrency).
Per request it records the time to first token, every inter-chunk gap and the end-to-end latency;
output tokens come from the server's usage report when it sends one (stream_options.include_usage).
The client is aiohttp with msgspec's JSON decoder: a third of httpx's CPU per streamed token (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import msgspec

from skiff.bench.workloads import BenchRequest

_decode = msgspec.json.Decoder().decode


@dataclass
class RequestResult:
    ok: bool
    prompt_len: int
    output_len: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    start: float = 0.0
    error: str = ""


@dataclass
class ServeTarget:
    base_url: str
    model: str
    api: str = "completions"  # or "chat"
    api_key: str | None = None
    ignore_eos: bool = True
    temperature: float = 0.0
    timeout: float = 600.0

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + ("/chat/completions" if self.api == "chat" else "/completions")

    def body(self, req: BenchRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": req.max_tokens,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": req.prompt}]
        else:
            body["prompt"] = req.prompt
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body


async def _sse_data(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The payload of every `data:` line of an event stream, as its bytes arrive."""
    pending = b""
    async for data in content.iter_any():
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].strip()


async def send_one(session: aiohttp.ClientSession, target: ServeTarget, req: BenchRequest) -> RequestResult:
    res = RequestResult(ok=False, prompt_len=req.prompt_len)
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    t0 = res.start = time.perf_counter()
    last = t0
    chunks = 0
    try:
        async with session.post(target.url, json=target.body(req), headers=headers) as r:
            if r.status != 200:
                res.error = f"HTTP {r.status}: {(await r.read()).decode(errors='replace')[:200]}"
                return res
            async for payload in _sse_data(r.content):
                if payload == b"[DONE]":
                    break
                msg = _decode(payload)
                if "error" in msg:
                    res.error = str(msg["error"].get("message", msg["error"]))
                    return res
                if msg.get("usage"):
                    res.output_len = int(msg["usage"].get("completion_tokens") or 0)
                    res.prompt_len = int(msg["usage"].get("prompt_tokens") or res.prompt_len)
                choices = msg.get("choices") or []
                if not choices:
                    continue
                c = choices[0]
                piece = (c.get("delta") or {}).get("content") if target.api == "chat" else c.get("text")
                if piece:
                    now = time.perf_counter()
                    if chunks == 0:
                        res.ttft = now - t0
                    else:
                        res.itl.append(now - last)
                    last = now
                    chunks += 1
    except (TimeoutError, aiohttp.ClientError, msgspec.DecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
        return res
    res.e2e = time.perf_counter() - t0
    res.output_len = res.output_len or chunks
    res.ok = chunks > 0
    if not res.ok:
        res.error = "no tokens received"
    return res


async def run_load(
    target: ServeTarget,
    requests: list[BenchRequest],
    request_rate: float,
    max_concurrency: int | None,
    seed: int,
    progress: bool = True,
) -> tuple[list[RequestResult], float]:
    connector = aiohttp.TCPConnector(limit=max_concurrency or len(requests) or 1)
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    rng = random.Random(seed)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(requests), desc="requests", unit="req")

    timeout = aiohttp.ClientTimeout(total=target.timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:

        async def guarded(req: BenchRequest) -> RequestResult:
            if gate is None:
                result = await send_one(client, target, req)
            else:
                async with gate:
                    result = await send_one(client, target, req)
            if bar is not None:
                bar.update(1)
            return result

        tasks = []
        t0 = time.perf_counter()
        for req in requests:
            tasks.append(asyncio.create_task(guarded(req)))
            if math.isfinite(request_rate) and request_rate > 0:
                await asyncio.sleep(rng.expovariate(request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    return list(results), duration


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _dist(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    return {
        "mean": scale * sum(values) / len(values) if values else 0.0,
        **{f"p{q}": scale * percentile(values, q) for q in (50, 90, 99)},
    }


def summarize(results: list[RequestResult], duration: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_len for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    tpot = [(r.e2e - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1]
    itl = [gap for r in ok for gap in r.itl]
    return {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration,
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "input_throughput": in_tokens / duration if duration else 0.0,
        "output_throughput": out_tokens / duration if duration else 0.0,
        "ttft_ms": _dist([r.ttft for r in ok]),
        "tpot_ms": _dist(tpot),
        "itl_ms": _dist(itl),
        "e2e_ms": _dist([r.e2e for r in ok]),
        "per_stream_output_tok_s": _dist(
            [(r.output_len - 1) / (r.e2e - r.ttft) for r in ok if r.output_len > 1 and r.e2e > r.ttft],
            scale=1.0,
        ),
    }


def format_summary(s: dict[str, Any]) -> str:
    lines = [
        f"completed {s['completed']}  failed {s['failed']}  in {s['duration_s']:.2f} s",
        f"throughput: {s['request_throughput']:.2f} req/s, output {s['output_throughput']:.1f} tok/s, "
        f"input {s['input_throughput']:.1f} tok/s",
    ]
    for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E")):
        d = s[key]
        lines.append(
            f"{name:5s} ms: mean {d['mean']:.1f}  p50 {d['p50']:.1f}  p90 {d['p90']:.1f}  p99 {d['p99']:.1f}"
        )
    if s["errors"]:
        lines.append("errors: " + "; ".join(s["errors"]))
    return "\n".join(lines)


def plot(results: list[RequestResult], path: str) -> bool:
    """A latency plot (TTFT and per-token latency over the run); False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ok = [r for r in results if r.ok]
    t_start = min((r.start for r in ok), default=0.0)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.scatter([r.start - t_start for r in ok], [1000 * r.ttft for r in ok], s=8)
    a.set(xlabel="request start (s)", ylabel="TTFT (ms)", title="Time to first token")
    b.hist([1000 * g for r in ok for g in r.itl], bins=50)
    b.set(xlabel="inter-token latency (ms)", ylabel="count", title="Inter-token latency")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def result_json(
    summary: dict[str, Any], config: dict[str, Any], results: list[RequestResult]
) -> dict[str, Any]:
    return {
        "config": config,
        "summary": summary,
        "requests": [{k: v for k, v in asdict(r).items() if k != "itl"} for r in results],
    }
