"""One API worker's HTTP server: uvicorn with the pod's signal handling, and the watch that drains it.

Every API worker runs the same two: `skiff serve`'s own process (worker 0, which also starts and watches
the pod's children) and, with --api-workers N, N - 1 spawned ones (`run_api_worker`) that share its port.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from collections.abc import Callable

import uvicorn
from skiff_contract.tracing import Tracing
from skiff_contract.tracing import configure as configure_tracing
from skiff_process.workers import Ready, SignalledServer, listen_socket

from skiff.server import protocol as P
from skiff.server.api import create_app
from skiff.server.args import ServerArgs
from skiff.server.engine_client import EngineClient, PodInfo
from skiff.server.metrics import ServerMetrics

log = logging.getLogger("skiff.serve")
MONITOR_INTERVAL = 0.25


def http_server(
    args: ServerArgs, client: EngineClient, on_signal: Callable[[int], None], tracing: Tracing | None = None
) -> SignalledServer:
    config = uvicorn.Config(
        create_app(args, client, tracing),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=int(args.grace_period) + 5,
        access_log=False,
        lifespan="off",
    )
    return SignalledServer(config, on_signal)


async def watch(
    client: EngineClient, server: SignalledServer, grace_period: float, problem: Callable[[], str | None]
) -> bool:
    """Until the server stops: fail the pod on `problem()` (True is returned) and end what is still in
    flight once a drain's grace period is over."""
    drain_deadline = None
    while True:  # keeps watching during a drain: a child dying then must still fail in-flight work
        found = problem() or client.dead
        if found:
            client.mark_dead(found)
            server.should_exit = True
            return True
        if client.draining and drain_deadline is None:
            drain_deadline = time.monotonic() + grace_period
        if drain_deadline is not None and time.monotonic() > drain_deadline and client.requests:
            # grace is over: end what is left with an error rather than cutting connections
            client.fail_all(f"the server is shutting down (grace period of {grace_period:.0f} s is over)")
        await asyncio.sleep(MONITOR_INTERVAL)


def run_api_worker(
    index: int, ready: Ready, args: ServerArgs, endpoints: P.Endpoints, info: PodInfo, port: int
) -> None:
    """An extra API worker (--api-workers): its own inbox and HTTP socket on the first worker's port."""
    from skiff_process.child import setup_child

    setup_child(f"api-{index}", args.log_level)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # until uvicorn takes the signals over
    raise SystemExit(asyncio.run(_serve_worker(index, ready, args, endpoints, info, port)))


async def _serve_worker(
    index: int, ready: Ready, args: ServerArgs, endpoints: P.Endpoints, info: PodInfo, port: int
) -> int:
    client = EngineClient(endpoints, ServerMetrics(args.model_name), worker=index)
    client.adopt(info)
    client.metrics.set_cache_config(info.page_size, info.total_pages)
    client.start()
    # each worker process exports its own spans (the URL was checked by worker 0 before it spawned us)
    tracing = configure_tracing("skiff-serve", args.otlp_traces_endpoint)
    server = http_server(args, client, lambda sig: setattr(client, "draining", True), tracing)
    sock: socket.socket = listen_socket(args.host, port)
    ready.set()
    watcher = asyncio.ensure_future(watch(client, server, args.grace_period, lambda: None))
    try:
        await server.serve(sockets=[sock])
    finally:
        watcher.cancel()
        client.fail_all("the server is shutting down")
        client.close()
        if tracing is not None:
            tracing.shutdown()
    return 1 if client.dead else 0
