"""`skiff-router`: serve the in-cluster OpenAI endpoint (discovery from Kubernetes or a static file).

Nothing here imports prometheus_client: with --workers N the metrics mode is chosen first (skiff_process.workers).
"""

from __future__ import annotations

import argparse
import logging
import sys

from skiff_contract.tracing import ENDPOINT_HELP, TracingUnavailable, check_available


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
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="router processes on the one port (SO_REUSEPORT); each holds its own endpoint load and "
        "enforces 1/N of every API-key quota",
    )
    parser.add_argument("--otlp-traces-endpoint", default=None, help=ENDPOINT_HELP)
    parser.add_argument("--log-level", default="info")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.workers < 1:
        raise SystemExit("--workers must be >= 1")
    try:
        check_available(args.otlp_traces_endpoint)  # each process then starts its own exporter
    except TracingUnavailable as e:
        print(f"skiff-router: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    metrics_dir = None
    if args.workers > 1:
        from skiff_process.workers import use_multiprocess_metrics

        metrics_dir = use_multiprocess_metrics()
    from skiff_router.serving import serve

    try:
        return serve(args)
    finally:
        if metrics_dir:
            from skiff_process.workers import remove_metrics_dir

            remove_metrics_dir(metrics_dir)


if __name__ == "__main__":
    sys.exit(main())
