"""The dashboard and the alerts against a real Prometheus scraping a live Skiff: `skiff serve` (embedded
SmolLM2-135M on CPU), `skiff-router` in front of it and the operator against the test kube-apiserver, all
on 127.0.0.1, scraped every second with the labels a ServiceMonitor gives them. After some traffic (and a
few failures of each kind, so every error series exists), every panel query and every alert expression of
what the chart renders goes through Prometheus' HTTP API with the dashboard's variables at their defaults:
each parses, and each returns at least one series (alerts: with their threshold comparisons taken out, as
nothing should fire here). The rendered rules are loaded into the same Prometheus, which must accept them.

The one rendering this setup cannot feed: SkiffOperatorDown without the operator's ServiceMonitor (from
kube-state-metrics, which is not running here); the chart renders it only with `serviceMonitor.enabled`
false, and its promtool cases cover it. Dashboard queries need no exception."""

from __future__ import annotations

import os
import re
import shutil
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from support.kube import Api, create_isvc, kube_api
from support.kubelet import FakeKubelet
from support.ports import free_port
from support.process import Process, stop_all
from support.serve import PythonService, ServerProcess, child_env, small_backend
from support.waiting import wait_for
from test_observability import DASHBOARD, alert_rules, panels, rule_groups

pytestmark = pytest.mark.timeout(600)
NAMESPACE, RELEASE_NS, MODEL = "team-a", "skiff-system", "smol"
RATE_INTERVAL = "30s"  # what Grafana's $__rate_interval stands for here (several 1 s scrapes)
COMPARISON = re.compile(r"\s*(?:>=|<=|==|!=|>|<)\s*-?\d+(?:\.\d+)?")


def signal_of(expr: str) -> str:
    """An alert expression without its threshold comparisons: the series it compares."""
    return COMPARISON.sub("", expr)


@dataclass
class Stack:
    api: Api
    backend: ServerProcess
    router: PythonService
    operator: Process
    operator_metrics: int
    prometheus: Process
    prometheus_url: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = httpx.get(self.prometheus_url + "/api/v1/query", params={"query": expr}, timeout=30)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", f"{expr}\n -> {r.status_code} {body}"
        return body["data"]["result"]


def scrape_config(backend: str, router: str, operator: str, rules: Path) -> dict[str, Any]:
    """What the chart's ServiceMonitors make of the three targets: the model pod with its namespace and
    pod, the router likewise, the operator under its Service's job name with honorLabels."""

    def job(name: str, target: str, namespace: str, pod: str, **extra: Any) -> dict[str, Any]:
        labels = {"namespace": namespace, "pod": pod, "service": name}
        return {"job_name": name, "static_configs": [{"targets": [target], "labels": labels}], **extra}

    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            job(MODEL, backend, NAMESPACE, f"{MODEL}-0"),
            job("skiff-router", router, RELEASE_NS, "skiff-router-0"),
            job("skiff-operator-metrics", operator, RELEASE_NS, "skiff-operator-0", honor_labels=True),
        ],
    }


def start_prometheus(tmp: Path, config: dict[str, Any]) -> tuple[Process, str]:
    binary = shutil.which("prometheus")
    assert binary
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    argv = [
        binary,
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    return Process(argv, log_path=tmp / "prometheus.log", name="prometheus"), f"http://127.0.0.1:{port}"


def discovery_file(tmp: Path, backend: str) -> Path:
    """smol: the live backend; ghost: endpoints that refuse connections (503 upstream_unavailable after a
    retry); cold: scaled to zero (held, a scale-from-zero request, then 503 hold_timeout)."""
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    services = [
        {"name": MODEL, "models": [MODEL], "endpoints": [backend]},
        {"name": "ghost", "models": ["ghost"], "endpoints": dead},
        {"name": "cold", "models": ["cold"], "endpoints": [], "replicas": 0},
    ]
    path = tmp / "discovery.yaml"
    path.write_text(yaml.safe_dump({"services": services}))
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    if shutil.which("prometheus") is None:
        pytest.skip("the prometheus server is not installed (Debian package `prometheus`: scripts/install.d)")
    tmp = tmp_path_factory.mktemp("prometheus-live")
    rules = tmp / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups()}, sort_keys=False))
    with kube_api() as api:
        procs: list[Process] = []
        kubelet = FakeKubelet(api.core, NAMESPACE)
        try:
            backend = small_backend(MODEL)  # loads while the rest starts
            procs.append(backend)
            router_args = ["--static", str(discovery_file(tmp, backend.address)), "--host", "127.0.0.1"]
            router_args += ["--hold-timeout", "2", "--max-attempts", "2", "--refresh-interval", "0.2"]
            router = PythonService("skiff_router.main", [*router_args, "--log-level", "warning"])
            procs.append(router)
            metrics_port, health_port = free_port(), free_port()
            env = child_env() | {
                "KUBECONFIG": api.kubeconfig,
                "SKIFF_AUTOSCALE_INTERVAL": "2",
                "SKIFF_ROUTER_METRICS_URL": router.url + "/metrics",
            }
            operator = Process(
                [
                    *("python3", "-m", "skiff_operator.main", "--standalone", "--namespace", NAMESPACE),
                    f"--metrics-port={metrics_port}",
                    f"--health-port={health_port}",
                    "--log-level=warning",
                ],
                env=env,
                log_path=tmp / "operator.log",
                name="skiff-operator",
            )
            procs.append(operator)
            config = scrape_config(backend.address, router.address, f"127.0.0.1:{metrics_port}", rules)
            prometheus, url = start_prometheus(tmp, config)
            procs.append(prometheus)
            api.core.create_namespace({"metadata": {"name": NAMESPACE}})
            kubelet.start()
            prometheus.wait_http_ok(url + "/-/ready", 60)
            operator.wait_http_ok(f"http://127.0.0.1:{health_port}/healthz", 60)
            router.wait_ready(60)
            backend.wait_ready(400)
            yield Stack(api, backend, router, operator, metrics_port, prometheus, url)
        finally:
            kubelet.stop()
            stop_all(procs, grace=15)


def chat(url: str, model: str, stream: bool = False, max_tokens: int = 6) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": max_tokens}
    return httpx.post(url + "/v1/chat/completions", json=body | {"stream": stream}, timeout=120)


def internal_error(backend: ServerProcess) -> httpx.Response:
    """A 500 from the catch-all handler: the engine's integrity check times out with the scheduler stopped."""
    scheduler = backend.pids()["scheduler"]
    os.kill(scheduler, signal.SIGSTOP)
    try:
        return httpx.get(backend.url + "/skiff/integrity", timeout=30)
    finally:
        os.kill(scheduler, signal.SIGCONT)


def make_traffic(s: Stack) -> None:
    """InferenceServices for the operator, one failure of each kind, and a few good requests."""
    create_isvc(
        s.api,
        NAMESPACE,
        MODEL,
        {
            "resources": {"gpus": 0},
            "model": {"servedName": MODEL},
            "autoscaling": {"mode": "operator", "minReplicas": 1, "maxReplicas": 2},
        },
    )
    # the API server refuses its Service (422): a reconcile failure kopf keeps retrying
    create_isvc(
        s.api, NAMESPACE, "broken", {"resources": {"gpus": 0}, "service": {"annotations": {"a b": "c"}}}
    )
    failed: dict[str, httpx.Response] = {}
    stalled = threading.Thread(target=lambda: failed.setdefault("500", internal_error(s.backend)))
    stalled.start()
    assert chat(s.router.url, "ghost").json()["error"]["code"] == "upstream_unavailable"
    assert chat(s.router.url, "cold").json()["error"]["code"] == "hold_timeout"
    stalled.join(60)
    assert failed["500"].status_code == 500
    bad = httpx.post(s.backend.url + "/v1/completions", json={"model": MODEL, "max_tokens": -1}, timeout=30)
    assert bad.status_code == 400
    for stream in (False, True, False):
        assert chat(s.router.url, MODEL, stream).status_code == 200


def default_variables(s: Stack) -> dict[str, str]:
    """The dashboard's variables as Grafana substitutes them by default (All: their allValue); each
    variable's own query must list this setup's value."""
    import json

    dashboard = json.loads(DASHBOARD.read_text())
    out = {"$__rate_interval": RATE_INTERVAL}
    for v in dashboard["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"]["query"])
        assert m, v["query"]
        match = m[1].replace('"$namespace"', '".*"')
        values = httpx.get(
            s.prometheus_url + f"/api/v1/label/{m[2]}/values", params={"match[]": match}, timeout=10
        ).json()["data"]
        assert {"namespace": NAMESPACE, "model": MODEL}[v["name"]] in values, (v["name"], values)
        out["$" + v["name"]] = v["allValue"]
    return out


def substitute(expr: str, variables: dict[str, str]) -> str:
    for name in sorted(variables, key=len, reverse=True):  # $__rate_interval before shorter names
        expr = expr.replace(name, variables[name])
    return expr


def test_every_panel_and_alert_returns_series(stack: Stack) -> None:
    import json

    make_traffic(stack)
    # scraped: the last requests, the operator's decisions and its retried failure
    wanted = [
        'skiff_operator_autoscaler_decisions_total{inferenceservice="smol"}',
        'skiff_operator_reconcile_failures_total{inferenceservice="broken", reason="Invalid"}',
        'skiff_operator_inferenceservice_phase{inferenceservice="smol", phase="Ready"} == 1',
        'sum(skiff_router_routed_total{model="smol"}) >= 3',
        # a labelled counter is exported from its first increment, and rate() needs two scrapes of it: on a
        # loaded CI machine the panels' queries once ran one scrape after the first finished request
        f"sum(rate(skiff:requests_finished_total[{RATE_INTERVAL}]))",
    ]
    wait_for(
        lambda: all(stack.query(q) for q in wanted),
        90,
        "the operator's and the router's series in Prometheus",
        log=stack.operator.log_path,
    )
    variables = default_variables(stack)
    dashboard = json.loads(DASHBOARD.read_text())
    rules = alert_rules(rule_groups())
    exprs = {
        f"panel {p['id']} {p['title']!r} {t['refId']}": substitute(t["expr"], variables)
        for p in panels(dashboard)
        for t in p["targets"]
    }
    exprs |= {f"alert {name}, threshold left out": signal_of(rule["expr"]) for name, rule in rules.items()}
    as_they_stand = [rule["expr"] for rule in rules.values()]
    with ThreadPoolExecutor(8) as pool:
        results = dict(zip(exprs, pool.map(stack.query, exprs.values()), strict=True))
        list(pool.map(stack.query, as_they_stand))  # each parses (stack.query asserts it); none need match
    empty = [f"{what}: {exprs[what]}" for what, series in results.items() if not series]
    assert not empty, "queries with no series:\n" + "\n".join(empty)
    # Prometheus loaded the chart's rules and evaluates them without errors
    assert set(rule_health(stack)) == set(rules)
    wait_for(lambda: all(h == ("ok", "") for h in rule_health(stack).values()), 10, "every rule healthy")


def rule_health(s: Stack) -> dict[str, tuple[str, str]]:
    loaded = httpx.get(s.prometheus_url + "/api/v1/rules", timeout=10).json()["data"]["groups"]
    return {r["name"]: (r["health"], r.get("lastError", "")) for g in loaded for r in g["rules"]}
