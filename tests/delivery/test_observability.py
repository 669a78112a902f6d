"""The Grafana dashboard and the alerts the chart ships, rendered by real Helm with
ci/observability-values.yaml: the dashboard's queries read only series the runtime and the router really
export (their live registries), filtered by the dashboard's variables; the alert rules pass
`promtool check rules` and the `promtool test rules` cases in tests/delivery/promtool/; each alert has a
runbook in docs/operations.md. The operator's metrics come from its live registry too (one status fed in,
so the per-service families have samples)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from delivery_helpers import CHART, ROOT, find, renderer, values_of
from prometheus_client.metrics import MetricWrapperBase
from skiff.server.metrics import ServerMetrics
from skiff_operator.metrics import OperatorMetrics
from skiff_router.metrics import RouterMetrics

OBSERVABILITY_VALUES = CHART / "ci" / "observability-values.yaml"
DASHBOARD = CHART / "dashboards" / "skiff.json"
PROMTOOL_CASES = Path(__file__).parent / "promtool" / "alerts_test.yaml"
# SkiffOperatorDown as rendered without the operator's ServiceMonitor (from kube-state-metrics).
PROMTOOL_KSM_CASES = Path(__file__).parent / "promtool" / "operator_down_ksm_test.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
ALERTS = {
    "SkiffTTFTP99OverBudget",
    "SkiffQueueGrowing",
    "SkiffKVCacheSaturated",
    "SkiffErrorRatioHigh",
    "SkiffModelNoReadyEndpoint",
    "SkiffRouterRejecting",
    "SkiffReconcileFailing",
    "SkiffOperatorDown",
}

# The exceptions to "only series Skiff exports": Prometheus' own `up` (SkiffOperatorDown with the operator's
# ServiceMonitor) and kube-state-metrics' Deployment series (SkiffOperatorDown without it). The dashboard
# reads neither.
PROMETHEUS = {"up"}
KUBE_STATE_METRICS = {"kube_deployment_spec_replicas", "kube_deployment_status_replicas_available"}
# Series names a metric family exposes, by type (prometheus_client drops `_total` from a counter's name).
_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
_PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def exported(metrics: ServerMetrics | RouterMetrics | OperatorMetrics) -> dict[str, frozenset[str]]:
    """Series name -> label names of every metric on a live metrics object's registry."""
    labels = {
        w._name: frozenset(w._labelnames)  # a family's label names; unlabelled ones have no samples yet
        for w in vars(metrics).values()
        if isinstance(w, MetricWrapperBase)
    }
    out = {}
    for family in metrics.registry.collect():
        sampled = frozenset(name for s in family.samples for name in s.labels if name != "le")
        for suffix in _SUFFIXES[family.type]:
            out[family.name + suffix] = labels.get(family.name, frozenset()) | sampled
    return out


def operator_metrics() -> OperatorMetrics:
    m = OperatorMetrics()
    m.record_status({"metadata": {"namespace": "ml", "name": "chat"}, "spec": {}}, {"phase": "Ready"})
    return m


RUNTIME = exported(ServerMetrics("m"))
ROUTER = exported(RouterMetrics())
OPERATOR = exported(operator_metrics())


def strip_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression reads (functions, keywords and label lists left out)."""
    e = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", strip_strings(expr))
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w.:$])[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        if m[0] not in _PROMQL_WORDS and not e[m.end() :].lstrip().startswith("("):
            names.add(m[0])
    return names


def selectors(expr: str) -> list[tuple[str, dict[str, tuple[str, str]]]]:
    """(metric, {label: (operator, value)}) of every `metric{...}` selector."""
    out = []
    for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr):
        matchers = re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"', m[2])
        out.append((m[1], {label: (op, value) for label, op, value in matchers}))
    return out


def observability_objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    merged = values_of(OBSERVABILITY_VALUES)
    for key, sub in (values or {}).items():
        merged[key] = {**merged.get(key, {}), **sub}
    return [o for objs in renderer.render(merged).values() for o in objs]


def rule_groups(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    (rule,) = find(observability_objects(values), "PrometheusRule")
    return rule["spec"]["groups"]


def alert_rules(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in groups for r in g["rules"]}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def queries(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(dashboard) for t in p["targets"]]


# --- the chart's objects ---------------------------------------------------------------------------------


def test_off_by_default(rendered):
    objs = rendered["default-values"]
    assert not find(objs, "PrometheusRule") and not find(objs, "ConfigMap")


def test_dashboard_configmap_carries_the_json(rendered, dashboard):
    (cm,) = find(rendered["observability-values"], "ConfigMap", "skiff-dashboard")
    assert cm["metadata"]["namespace"] == "skiff-system"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "LLM serving"}
    assert json.loads(cm["data"]["skiff.json"]) == dashboard


def test_dashboard_sidecar_settings_are_values():
    values = {"dashboards": {"namespace": "monitoring", "label": "example.com/dash", "labelValue": "yes"}}
    values["dashboards"] |= {"folder": "", "labels": {"team": "ml"}}
    (cm,) = find(observability_objects(values), "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring" and "annotations" not in cm["metadata"]
    assert {"example.com/dash": "yes", "team": "ml"}.items() <= cm["metadata"]["labels"].items()
    assert "grafana_dashboard" not in cm["metadata"]["labels"]


def test_prometheus_rule_groups(rendered):
    (rule,) = find(rendered["observability-values"], "PrometheusRule", "skiff")
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    groups = rule["spec"]["groups"]
    assert [g["name"] for g in groups] == ["skiff-runtime", "skiff-router", "skiff-operator"]
    rules = alert_rules(groups)
    assert set(rules) == ALERTS
    base = values_of(CHART / "values.yaml")["alerts"]["runbookBaseUrl"]
    for name, r in rules.items():
        assert r["labels"]["severity"] in {"warning", "critical"} and r["labels"]["team"] == "ml-platform"
        assert set(r["annotations"]) == {"summary", "description", "runbook_url"}, name
        assert r["annotations"]["runbook_url"] == f"{base}#{name.lower()}"
        assert re.fullmatch(r"\d+[mh]", r["for"]), name


def test_every_alert_has_a_runbook_section():
    headings = re.findall(r"^### (\S+)$", OPERATIONS.read_text(), flags=re.M)
    assert set(headings) >= ALERTS, ALERTS - set(headings)


def test_thresholds_and_durations_come_from_values():
    rules = alert_rules(
        rule_groups({"alerts": {"ttftP99Seconds": 2.5, "kvUsage": 0.9, "for": {"ttft": "3m"}}})
    )
    assert rules["SkiffTTFTP99OverBudget"]["expr"].endswith("> 2.5")
    assert rules["SkiffTTFTP99OverBudget"]["for"] == "3m"
    assert rules["SkiffKVCacheSaturated"]["expr"].endswith("> 0.9")
    assert rules["SkiffQueueGrowing"]["for"] == "10m"  # the other durations keep their defaults


def test_router_alerts_only_with_a_router():
    groups = rule_groups({"router": {"enabled": False}})
    assert [g["name"] for g in groups] == ["skiff-runtime", "skiff-operator"]


def test_operator_down_reads_the_operator_scrape_with_its_service_monitor():
    values = {"alerts": {"enabled": True}, "serviceMonitor": {"enabled": True}}
    objs = [o for v in renderer.render(values, release="ml", namespace="serving").values() for o in v]
    (rule,) = find(objs, "PrometheusRule", "ml-skiff")
    down = alert_rules(rule["spec"]["groups"])["SkiffOperatorDown"]["expr"]
    # Prometheus Operator names a ServiceMonitor's job after the Service it scrapes
    (service,) = find(objs, "Service", "ml-skiff-operator-metrics")
    assert find(objs, "ServiceMonitor", "ml-skiff-operator")
    assert "absent(up{" in down
    assert dict(selectors(down)) == {
        "up": {"namespace": ("=", "serving"), "job": ("=", service["metadata"]["name"])}
    }


def test_operator_down_watches_this_release():
    objs = [
        o
        for v in renderer.render({"alerts": {"enabled": True}}, release="ml", namespace="serving").values()
        for o in v
    ]
    (rule,) = find(objs, "PrometheusRule", "ml-skiff")
    down = alert_rules(rule["spec"]["groups"])["SkiffOperatorDown"]["expr"]
    assert {m: labels for m, labels in selectors(down)} == {
        m: {"namespace": ("=", "serving"), "deployment": ("=", "ml-skiff-operator")}
        for m in ("kube_deployment_status_replicas_available", "kube_deployment_spec_replicas")
    }


def test_tracing_is_off_by_default_and_one_value_turns_it_on():
    def args(objs: list[dict[str, Any]], deployment: str) -> list[str]:
        (d,) = find(objs, "Deployment", deployment)
        return d["spec"]["template"]["spec"]["containers"][0]["args"]

    default = observability_objects()
    for name in ("skiff-router", "skiff-operator"):
        assert not [a for a in args(default, name) if a.startswith("--otlp-traces-endpoint")]
    url = "http://otel-collector.observability:4318"
    traced = observability_objects({"tracing": {"otlpTracesEndpoint": url}})
    for name in ("skiff-router", "skiff-operator"):
        assert f"--otlp-traces-endpoint={url}" in args(traced, name), name


BAD_VALUES = [
    ({"tracing": {"otlpTracesEndpoint": "otel-collector:4318"}}, "/tracing/otlpTracesEndpoint"),
    ({"alerts": {"kvUsage": 1.5}}, "/alerts/kvUsage"),
    ({"alerts": {"for": {"ttft": "ten minutes"}}}, "/alerts/for/ttft"),
    ({"alerts": {"for": {"tftt": "5m"}}}, "additional properties 'tftt' not allowed"),
    ({"alerts": {"alertLabels": {"severity": "page"}}}, "invalid propertyName 'severity'"),
    ({"alerts": {"runbookBaseUrl": "https://example.invalid/ops.md#top"}}, "/alerts/runbookBaseUrl"),
    ({"dashboards": {"label": "not a label"}}, "/dashboards/label"),
    ({"dashboards": {"enable": True}}, "additional properties 'enable' not allowed"),
]


@pytest.mark.parametrize(("values", "message"), BAD_VALUES, ids=[m for _, m in BAD_VALUES])
def test_schema_rejects_bad_observability_values(values, message):
    with helm.Chart.load(str(CHART)) as c, pytest.raises(helm.HelmValuesError) as err:
        c.validate_schema(values)
    assert message in str(err.value)


# --- the dashboard -----------------------------------------------------------------------------------------


def test_panel_ids_unique_and_layout_without_overlaps(dashboard):
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_rows(dashboard):
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert [r.split(":")[0] for r in rows] == ["Traffic", "Latency", "Engine", "Router", "Operator"]


def test_variables(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name, label in (("namespace", "namespace"), ("model", "model_name")):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"] == DATASOURCE
        assert v["multi"] and v["includeAll"]
        metric = re.fullmatch(rf"label_values\(([\w:]+)(\{{[^}}]*\}})?, {label}\)", v["query"]["query"])
        assert metric and metric[1] in RUNTIME and label in RUNTIME[metric[1]] | {"namespace"}, v["query"]


def test_every_panel_and_target_uses_the_datasource_variable(dashboard):
    for p in dashboard["panels"]:
        assert p["datasource"] == DATASOURCE, p["title"]
        for t in p.get("targets", []):
            assert t["datasource"] == DATASOURCE, p["title"]


def test_units_thresholds_and_legends(dashboard):
    for p in panels(dashboard):
        assert p["type"] in {"timeseries", "stat"}, p["title"]
        defaults = p["fieldConfig"]["defaults"]
        assert defaults.get("unit"), p["title"]
        assert defaults["thresholds"]["steps"][0]["value"] is None, p["title"]
        assert p["description"], p["title"]
        for t in p["targets"]:
            assert t["legendFormat"] and t["refId"], p["title"]
        if p["type"] == "timeseries":
            assert p["options"]["legend"]["showLegend"], p["title"]


def test_latency_quantiles(dashboard):
    exprs = queries(dashboard)
    for histogram in (
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:inter_token_latency_seconds_bucket",
        "sglang:e2e_request_latency_seconds_bucket",
    ):
        for q in ("0.5", "0.9", "0.99"):
            assert any(e.startswith(f"histogram_quantile({q}, ") and histogram in e for e in exprs), (
                histogram,
                q,
            )


def test_queries_read_only_exported_series(dashboard):
    known = RUNTIME.keys() | ROUTER.keys() | OPERATOR.keys()
    used = set()
    for expr in queries(dashboard):
        assert metric_names(expr) <= known, (metric_names(expr) - known, expr)
        used |= metric_names(expr)
    assert not used - known
    # Every metric the dashboard shows is in a row: runtime, router and operator alike.
    assert used & RUNTIME.keys() and used & ROUTER.keys() and used & OPERATOR.keys()


def test_operator_row_reads_every_operator_metric(dashboard):
    rows = [p for p in dashboard["panels"] if p["type"] == "row"]
    start = next(r["gridPos"]["y"] for r in rows if r["title"] == "Operator")
    exprs = [t["expr"] for p in panels(dashboard) if p["gridPos"]["y"] > start for t in p["targets"]]
    used = set().union(*(metric_names(e) for e in exprs))
    families = {n.removesuffix("_bucket") for n in OPERATOR if not n.endswith(("_sum", "_count"))}
    assert {n.removesuffix("_bucket") for n in used} == families


def test_queries_filter_by_the_variables(dashboard):
    """Runtime series carry model_name, plus namespace from the scrape; the router's carry model (their
    namespace is the router's own, so they are not filtered by it); the operator's carry the
    InferenceService's namespace, and model_name where they describe one service's status."""
    for expr in queries(dashboard):
        bare = re.sub(r"[a-zA-Z_:][a-zA-Z0-9_:]*\{[^}]*\}", " ", expr)
        assert not metric_names(bare), f"a selector without label matchers in {expr}"
        assert re.findall(r"\[([^\]]*)\]", expr) == ["$__rate_interval"] * len(re.findall(r"\[", expr))
        for metric, labels in selectors(expr):
            wanted = {}
            if metric in RUNTIME:
                wanted = {"namespace": "$namespace", "model_name": "$model"}
                assert "model_name" in RUNTIME[metric], metric
            elif metric in ROUTER:
                wanted = {"model": "$model"}
                assert "model" in ROUTER[metric], metric
            elif metric in OPERATOR:
                wanted = {"namespace": "$namespace"}
                assert "namespace" in OPERATOR[metric], metric
                if "model_name" in OPERATOR[metric]:
                    wanted["model_name"] = "$model"
            for label, variable in wanted.items():
                assert labels.get(label) == ("=~", variable), (metric, label, expr)
            for label in ("namespace", "model_name", "model"):
                assert label not in labels or labels[label][1].startswith("$"), f"hard-coded {label}: {expr}"


def test_queries_parse(dashboard, tmp_path):
    """promtool parses every dashboard query (Grafana's variables replaced by what they expand to)."""
    promtool = need_promtool()
    rules = []
    for p in panels(dashboard):
        for t in p["targets"]:
            expr = t["expr"].replace("$__rate_interval", "5m").replace("$namespace", ".*")
            rules.append(
                {"record": f"dashboard:panel_{p['id']}_{t['refId']}", "expr": expr.replace("$model", ".*")}
            )
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run_promtool(promtool, "check", "rules", str(path))


# --- the alerts through promtool -----------------------------------------------------------------------


def need_promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(
            "promtool is not installed (Debian package `prometheus`; scripts/install.sh --dev adds it)"
        )
    return promtool


def run_promtool(promtool: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def write_rules(
    tmp_path: Path, groups: list[dict[str, Any]], name: str = "rules.yaml", cases: Path = PROMTOOL_CASES
) -> Path:
    """The rendered groups as a plain rules file, next to the promtool cases that load it."""
    (tmp_path / name).write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    shutil.copy(cases, tmp_path / cases.name)
    return tmp_path / name


def test_alert_expressions_read_only_exported_series(rendered):
    known = RUNTIME.keys() | ROUTER.keys() | OPERATOR.keys() | PROMETHEUS
    rules = alert_rules(find(rendered["observability-values"], "PrometheusRule")[0]["spec"]["groups"])
    for name, r in rules.items():
        assert metric_names(r["expr"]) <= known, (name, metric_names(r["expr"]) - known)
    without_monitor = alert_rules(rule_groups({"serviceMonitor": {"enabled": False}}))
    assert metric_names(without_monitor["SkiffOperatorDown"]["expr"]) == KUBE_STATE_METRICS
    assert metric_names(rules["SkiffErrorRatioHigh"]["expr"]) == {
        "skiff:http_errors_total",
        "sglang:num_requests_total",
    }


@pytest.mark.parametrize(
    ("router", "monitor"),
    [(True, True), (False, True), (True, False)],
    ids=["all", "no-router", "no-monitor"],
)
def test_promtool_check_rules(tmp_path, router, monitor):
    promtool = need_promtool()
    groups = rule_groups({"router": {"enabled": router}, "serviceMonitor": {"enabled": monitor}})
    proc = run_promtool(promtool, "check", "rules", str(write_rules(tmp_path, groups)))
    assert f"SUCCESS: {sum(len(g['rules']) for g in groups)} rules found" in proc.stdout


def test_promtool_unit_tests_fire_each_alert(tmp_path):
    promtool = need_promtool()
    cases = yaml.safe_load(PROMTOOL_CASES.read_text())
    tested = {t["alertname"] for case in cases["tests"] for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert tested == ALERTS, "every alert needs a case that fires it"
    write_rules(tmp_path, rule_groups())
    run_promtool(promtool, "test", "rules", PROMTOOL_CASES.name, cwd=tmp_path)


def test_promtool_operator_down_from_kube_state_metrics(tmp_path):
    promtool = need_promtool()
    groups = rule_groups({"serviceMonitor": {"enabled": False}})
    write_rules(tmp_path, groups, "rules-ksm.yaml", PROMTOOL_KSM_CASES)
    run_promtool(promtool, "test", "rules", PROMTOOL_KSM_CASES.name, cwd=tmp_path)


def test_promtool_unit_tests_catch_a_changed_threshold(tmp_path):
    """The cases run against what the chart renders: a TTFT budget above the slow model's 9.95 s fails them."""
    promtool = need_promtool()
    write_rules(tmp_path, rule_groups({"alerts": {"ttftP99Seconds": 20}}))
    proc = subprocess.run(
        [promtool, "test", "rules", PROMTOOL_CASES.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "SkiffTTFTP99OverBudget" in proc.stdout + proc.stderr
