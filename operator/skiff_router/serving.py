"""Running the router: one uvicorn process, or with --workers N this process and N - 1 spawned siblings,
each with its own SO_REUSEPORT socket on the port, its own discovery and its own per-endpoint load.

The first process forwards SIGTERM to the others (all drain), and exits non-zero when one of them dies.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
from collections.abc import Iterator
from typing import Any

import uvicorn
from skiff_process.workers import Ready, Siblings, SignalledServer, listen_socket

from skiff_router.app import RouterConfig, create_app, create_metrics_app
from skiff_router.discovery import Source, StaticSource

GRACEFUL_SHUTDOWN = 30  # seconds in-flight streams get on SIGTERM
WATCH_INTERVAL = 0.5


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    """The RouterConfig fields that have a flag of the same name take its value."""
    for name in ("hold_cap", "max_attempts", "quota_replicas"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    if args.metrics_port is not None and (
        not 0 < args.metrics_port < 65536 or args.metrics_port == args.port
    ):
        raise SystemExit(f"--metrics-port must be a port number other than --port, got {args.metrics_port}")
    fields = {f.name for f in dataclasses.fields(RouterConfig)}
    return RouterConfig(**{k: v for k, v in vars(args).items() if k in fields})


def make_source(args: argparse.Namespace) -> Source:
    if args.static:
        return StaticSource(args.static, interval=min(args.refresh_interval, 1.0))
    from skiff_router.kube import KubeSource  # the kubernetes client, only for cluster discovery

    return KubeSource(
        namespaces=tuple(args.namespace or ()),
        interval=args.refresh_interval,
        kubeconfig=args.kubeconfig,
        peers_service=args.peers_service,
        peers_namespace=os.environ.get("POD_NAMESPACE", "default"),
    )


def uvicorn_config(args: argparse.Namespace) -> uvicorn.Config:
    return uvicorn.Config(
        create_app(make_source(args), config_from_args(args)),
        host=args.host,
        port=args.port,
        log_level=args.log_level.lower(),
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN,
    )


def serve(args: argparse.Namespace) -> int:
    if args.workers == 1 and args.metrics_port is None:
        server = uvicorn.Server(uvicorn_config(args))
        server.run()
        return 0 if server.started else 1
    return asyncio.run(_serve_first(args))


class _SideServer(uvicorn.Server):
    """The metrics listener (--metrics-port): it leaves the signals to the API server, which stops it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _start_side(args: argparse.Namespace, app: Any) -> tuple[_SideServer | None, asyncio.Future | None]:
    """/metrics on its own port, in the first process only (it sums every process's metrics)."""
    if args.metrics_port is None:
        return None, None
    config = uvicorn.Config(
        create_metrics_app(app), host=args.host, port=args.metrics_port, log_level=args.log_level.lower()
    )
    side = _SideServer(config)
    task = asyncio.ensure_future(side.serve())
    while not side.started and not task.done():
        await asyncio.sleep(0.01)
    if task.done():  # uvicorn exits when it cannot bind
        raise SystemExit("skiff-router: cannot listen on --metrics-port")
    return side, task


async def _serve_first(args: argparse.Namespace) -> int:
    sock = listen_socket(args.host, args.port)
    siblings = Siblings("router", args.workers, run_worker, args, sock.getsockname()[1])
    siblings.start()
    failed = False
    side, side_task = None, None
    try:
        await asyncio.to_thread(siblings.wait_ready, 120.0)
        # Kubernetes signals only this process: the siblings drain too
        server = SignalledServer(uvicorn_config(args), lambda sig: siblings.signal(signal.SIGTERM))
        side, side_task = await _start_side(args, server.config.app)

        async def watch() -> None:
            nonlocal failed
            while not server.should_exit:
                if siblings.dead():
                    failed = True
                    server.should_exit = True
                await asyncio.sleep(WATCH_INTERVAL)

        watcher = asyncio.create_task(watch())
        await server.serve(sockets=[sock])
        watcher.cancel()
    finally:
        if side is not None and side_task is not None:
            side.should_exit = True
            with contextlib.suppress(SystemExit):
                await side_task
        siblings.signal(signal.SIGTERM)
        await asyncio.to_thread(siblings.join, GRACEFUL_SHUTDOWN + 5)
    return 1 if failed else 0


def run_worker(index: int, ready: Ready, args: argparse.Namespace, port: int) -> None:
    """A sibling router process: the same app on its own socket of the first process's port."""
    from skiff_process.child import setup_child

    setup_child(f"router-{index}", args.log_level)
    sock = listen_socket(args.host, port)
    server = SignalledServer(uvicorn_config(args), lambda sig: None)
    ready.set()
    server.run(sockets=[sock])
