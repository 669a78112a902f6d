"""`skiff-operator`: runs the kopf operator for InferenceService (skiff.dev/v1alpha1)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

import kopf

from . import handlers
from .access import NetworkPolicySettings
from .render import OperatorSettings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="skiff-operator", description=__doc__)
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="namespace to watch (repeatable; glob patterns allowed); default: all namespaces",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "--health-port",
        type=int,
        default=8080,
        help="liveness endpoint http://0.0.0.0:PORT/healthz (0 disables)",
    )
    parser.add_argument(
        "--peering",
        default="skiff-operator",
        help="kopf peering object name shared by operator replicas (needs the kopf.dev CRDs)",
    )
    parser.add_argument("--standalone", action="store_true", help="run without peering (a single replica)")
    parser.add_argument("--priority", type=int, default=0, help="peering priority; the highest one runs")
    parser.add_argument(
        "--default-image",
        default=OperatorSettings.default_image,
        help="runtime image for InferenceServices that set no runtime.image",
    )
    parser.add_argument("--cluster-domain", default=OperatorSettings.cluster_domain)
    parser.add_argument(
        "--internal-api-keys",
        action="store_true",
        help="the router fronts the services: pods of InferenceServices without apiKeySecretRef require an "
        "internal key the operator keeps in the Secret <name>-internal-key",
    )
    parser.add_argument(
        "--key-rotation-min-seconds",
        type=float,
        default=OperatorSettings.key_rotation_min_seconds,
        help="a requested internal-key rotation waits this long after the previous one",
    )
    parser.add_argument(
        "--network-policy",
        metavar="JSON",
        default=None,
        help='a NetworkPolicy per InferenceService: {"apiFrom": [peers], "metricsFrom": [peers]} '
        "(NetworkPolicyPeers admitted to the pods' API and metrics ports)",
    )
    return parser


def configure_logging(level: str) -> None:
    """One handler (kopf's) on the root logger, so each line is printed once. At info, kopf's per-object
    chatter ("Handler ... succeeded" for every child event) is left out; its warnings and errors stay."""
    kopf.configure(verbose=level == "debug", log_format=kopf.LogFormat.FULL)
    logging.getLogger().setLevel(level.upper())
    chatter = logging.DEBUG if level == "debug" else max(logging.WARNING, logging.getLevelName(level.upper()))
    logging.getLogger("kopf.objects").setLevel(chatter)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        policy = NetworkPolicySettings.parse(args.network_policy) if args.network_policy else None
    except ValueError as e:
        parser.error(str(e))
    configure_logging(args.log_level)
    handlers.STATE.settings = dataclasses.replace(
        handlers.STATE.settings,
        default_image=args.default_image,
        cluster_domain=args.cluster_domain,
        internal_api_keys=args.internal_api_keys,
        key_rotation_min_seconds=args.key_rotation_min_seconds,
        network_policy=policy,
    )
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=args.standalone,
        peering_name=None if args.standalone else args.peering,
        priority=args.priority,
        liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
