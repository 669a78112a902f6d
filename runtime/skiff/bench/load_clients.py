"""The load generator's client processes, and the check that tells when a client itself was the limit.

Each client process drives an even share of the requests (every n-th one, at rate / n, concurrency / n) on
its own event loop. It reports its CPU share and its event loop's lag: a loop that is late to wake a 10 ms
timer is late to read the server's chunks as well, so its latencies are the client's, not the server's.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import queue
import time
from dataclasses import asdict, dataclass

from skiff.bench.serve_client import RequestResult, ServeTarget, percentile, run_load
from skiff.bench.workloads import BenchRequest

TICK = 0.01  # seconds of the lag probe's timer
SATURATED_CPU_SHARE = 0.85
SATURATED_LAG_MS = 20.0


@dataclass
class ClientReport:
    index: int
    requests: int
    cpu_share: float  # CPU seconds of the client process per wall second of its run
    loop_lag_p99_ms: float

    @property
    def saturated(self) -> bool:
        return self.cpu_share >= SATURATED_CPU_SHARE or self.loop_lag_p99_ms >= SATURATED_LAG_MS


@dataclass
class ClientRun:
    results: list[RequestResult]
    began: float  # perf_counter (CLOCK_MONOTONIC: the same clock in every process)
    duration: float
    report: ClientReport


async def measured_load(
    index: int,
    target: ServeTarget,
    requests: list[BenchRequest],
    request_rate: float,
    max_concurrency: int | None,
    seed: int,
    progress: bool,
) -> ClientRun:
    lags: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        while not done.is_set():
            t = time.perf_counter()
            await asyncio.sleep(TICK)
            lags.append(time.perf_counter() - t - TICK)

    prober = asyncio.create_task(probe())
    cpu0, began = time.process_time(), time.perf_counter()
    results, duration = await run_load(target, requests, request_rate, max_concurrency, seed, progress)
    cpu = time.process_time() - cpu0
    done.set()
    await prober
    share = cpu / duration if duration > 0 else 0.0
    return ClientRun(
        results, began, duration, ClientReport(index, len(requests), share, 1000 * percentile(lags, 99))
    )


def _client_main(index: int, args: tuple, start: mp.synchronize.Barrier, out: mp.Queue) -> None:
    start.wait()  # every client imported and ready: they begin together
    run = asyncio.run(measured_load(index, *args, progress=False))
    out.put((index, [asdict(r) for r in run.results], run.began, run.duration, asdict(run.report)))


def run_clients(
    target: ServeTarget,
    requests: list[BenchRequest],
    request_rate: float,
    max_concurrency: int | None,
    seed: int,
    num_clients: int = 1,
    progress: bool = True,
    timeout: float = 3600.0,
) -> tuple[list[RequestResult], float, list[ClientReport]]:
    """(results in request order, duration of the whole run, one report per client)."""
    if num_clients <= 1:
        run = asyncio.run(measured_load(0, target, requests, request_rate, max_concurrency, seed, progress))
        return run.results, run.duration, [run.report]
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(num_clients + 1), ctx.Queue()
    share_conc = None if max_concurrency is None else math.ceil(max_concurrency / num_clients)
    procs = []
    for i in range(num_clients):
        args = (target, requests[i::num_clients], request_rate / num_clients, share_conc, seed + i)
        p = ctx.Process(
            target=_client_main, args=(i, args, start, out), name=f"bench-client-{i}", daemon=True
        )
        p.start()
        procs.append(p)
    got = {}
    deadline = time.monotonic() + timeout
    try:
        start.wait(timeout=120.0)
        while len(got) < num_clients:
            if not all(p.is_alive() or p.exitcode == 0 for p in procs):
                raise RuntimeError("a load-generator client process failed")
            try:
                index, results, began, duration, report = out.get(timeout=1.0)
            except queue.Empty:  # poll the processes again
                if time.monotonic() > deadline:
                    raise TimeoutError("the load-generator clients did not finish in time") from None
                continue
            got[index] = ([RequestResult(**r) for r in results], began, duration, ClientReport(**report))
    finally:
        for p in procs:
            p.join(5.0)
            if p.is_alive():
                p.terminate()
    began = min(g[1] for g in got.values())
    ended = max(g[1] + g[2] for g in got.values())
    ordered: list[RequestResult] = [None] * len(requests)  # type: ignore[list-item]
    for i, (results, *_rest) in got.items():
        ordered[i::num_clients] = results
    return ordered, ended - began, [got[i][3] for i in range(num_clients)]


def saturation_note(reports: list[ClientReport]) -> str | None:
    busy = [r for r in reports if r.saturated]
    if not busy:
        return None
    worst = max(busy, key=lambda r: r.cpu_share)
    return (
        f"the load generator was saturated ({len(busy)} of {len(reports)} client processes; client "
        f"{worst.index}: {100 * worst.cpu_share:.0f}% CPU, loop lag p99 {worst.loop_lag_p99_ms:.0f} ms): "
        "these latencies are partly the client's; raise --num-clients"
    )
