"""The command lines the chart renders are accepted by the real `skiff-operator` and `skiff-router`
parsers, and the HA wrapper draws a distinct kopf priority per replica."""

from __future__ import annotations

import os
import subprocess

import pytest
from delivery_helpers import VALUES_FILES, find, renderer, values_of


def container(objs, name):
    (dep,) = find(objs, "Deployment", name)
    return dep["spec"]["template"]["spec"]["containers"][0]


def k8s_expand(arg: str) -> str:
    """Kubernetes' $(VAR) expansion for args with no env references: `$$` becomes `$`."""
    return arg.replace("$$", "$")


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=lambda p: p.stem)
def test_operator_and_router_args_parse(values_file):
    from skiff_operator.main import build_parser
    from skiff_router.main import build_parser as router_parser

    objs = [o for v in renderer.render(values_of(values_file)).values() for o in v]
    op = build_parser().parse_args(container(objs, "skiff-operator")["args"])
    watched = values_of(values_file).get("operator", {}).get("watchNamespaces", [])
    assert op.namespace == watched
    assert op.default_image.startswith("skiff-project/skiff:")
    if find(objs, "Deployment", "skiff-router"):
        rc = container(objs, "skiff-router")
        assert rc["command"] == ["skiff-router"]
        args = router_parser().parse_args(rc["args"])
        assert args.port == rc["ports"][0]["containerPort"] and (args.namespace or []) == watched


def test_ha_wrapper_draws_random_priorities(tmp_path):
    from skiff_operator.main import build_parser

    objs = [o for v in renderer.render({"operator": {"replicas": 3}}).values() for o in v]
    c = container(objs, "skiff-operator")
    shim = tmp_path / "skiff-operator"  # stands in for the console script: hands back its argv
    shim.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    cmd = [k8s_expand(a) for a in c["command"]] + c["args"]
    seen = set()
    for _ in range(3):
        argv = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=30, check=True
        ).stdout.splitlines()
        args = build_parser().parse_args(argv)
        assert args.peering == "skiff-operator" and not args.standalone
        seen.add(args.priority)
    assert len(seen) == 3, seen


def test_metrics_port_and_tracing_reach_the_parsers():
    from skiff_operator.main import build_parser
    from skiff_router.main import build_parser as router_parser

    url = "http://otel-collector.observability:4318"
    values = {"tracing": {"otlpTracesEndpoint": url}, "operator": {"metricsPort": 9090}}
    objs = [o for v in renderer.render(values).values() for o in v]
    oc = container(objs, "skiff-operator")
    op = build_parser().parse_args(oc["args"])
    assert op.metrics_port == 9090 == {p["name"]: p["containerPort"] for p in oc["ports"]}["metrics"]
    assert op.otlp_traces_endpoint == url
    assert router_parser().parse_args(container(objs, "skiff-router")["args"]).otlp_traces_endpoint == url
