"""`skiff-router`: serve the in-cluster OpenAI endpoint (discovery from Kubernetes or a static file)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Iterator

import uvicorn

from skiff_router.app import RouterConfig, create_app, create_metrics_app
from skiff_router.discovery import Source, StaticSource


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="skiff-router",
        description="the in-cluster OpenAI endpoint that routes by model to InferenceServices",
    )
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics on this port only (not on --port), so a network policy can open one alone",
    )
    src = parser.add_mutually_exclusive_group()
    src.add_argument(
        "--static",
        metavar="FILE",
        help="YAML/JSON file listing services, endpoints and api keys (re-read when it changes)",
    )
    src.add_argument(
        "--namespace",
        action="append",
        default=None,
        help="watch this namespace (repeatable; default: all namespaces)",
    )
    parser.add_argument(
        "--kubeconfig", help="kubeconfig file (default: in-cluster credentials, else ~/.kube/config)"
    )
    parser.add_argument(
        "--refresh-interval", type=float, default=2.0, help="seconds between discovery refreshes"
    )
    parser.add_argument(
        "--hold-cap",
        type=int,
        default=64,
        help="requests held per model while it has no ready replica; more get 503",
    )
    parser.add_argument(
        "--hold-timeout",
        type=float,
        default=120.0,
        help="seconds a held request waits for a replica before 503 + Retry-After",
    )
    parser.add_argument(
        "--keepalive-interval",
        type=float,
        default=5.0,
        help="seconds between SSE progress comments on held streaming requests",
    )
    parser.add_argument("--retry-after", type=int, default=10, help="Retry-After seconds sent with 503")
    parser.add_argument("--max-attempts", type=int, default=3, help="endpoints tried before the first byte")
    parser.add_argument(
        "--require-api-key",
        action="store_true",
        help="every model needs a key (otherwise only models with an apiKeySecretRef)",
    )
    parser.add_argument(
        "--quota-replicas",
        type=int,
        default=1,
        help="router replicas sharing the API-key quotas: each enforces 1/N of every limit",
    )
    parser.add_argument(
        "--peers-service",
        default=None,
        help="the routers' own Service: its ready endpoints give --quota-replicas while running "
        "(namespace from $POD_NAMESPACE)",
    )
    parser.add_argument("--log-level", default="info")
    return parser


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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    source: Source
    if args.static:
        source = StaticSource(args.static, interval=min(args.refresh_interval, 1.0))
    else:
        from skiff_router.kube import KubeSource  # the kubernetes client, only for cluster discovery

        source = KubeSource(
            namespaces=tuple(args.namespace or ()),
            interval=args.refresh_interval,
            kubeconfig=args.kubeconfig,
            peers_service=args.peers_service,
            peers_namespace=os.environ.get("POD_NAMESPACE", "default"),
        )
    config = config_from_args(args)
    app = create_app(source, config)
    main_server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level.lower(),
            timeout_graceful_shutdown=30,
        )
    )
    if config.metrics_port is None:
        main_server.run()
        return 0 if main_server.started else 1
    side = _SideServer(
        uvicorn.Config(
            create_metrics_app(app),
            host=args.host,
            port=config.metrics_port,
            log_level=args.log_level.lower(),
        )
    )
    return asyncio.run(_serve_both(main_server, side))


class _SideServer(uvicorn.Server):
    """The metrics listener: it leaves the signals to the API server, which stops it when it stops."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _serve_both(main_server: uvicorn.Server, side: _SideServer) -> int:
    side_task = asyncio.ensure_future(side.serve())
    while not side.started and not side_task.done():
        await asyncio.sleep(0.01)
    if side_task.done():  # uvicorn exits when it cannot bind
        print("skiff-router: cannot listen on --metrics-port", file=sys.stderr)
        return 1
    try:
        await main_server.serve()
    finally:
        side.should_exit = True
        with contextlib.suppress(SystemExit):
            await side_task
    return 0 if main_server.started else 1


if __name__ == "__main__":
    sys.exit(main())
