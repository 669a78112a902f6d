"""The operator's /metrics: the real operator (kopf's runner) against the test kube-apiserver, scraped over
HTTP from prometheus_client's own server; and the hooks on their own, fed what the handlers feed them."""

from __future__ import annotations

import kopf
import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families
from skiff_operator.metrics import METRICS, PHASES, OperatorMetrics, failure_reason
from skiff_operator.status import Observed, compute_status
from support.kube import Api, create_isvc, patch_isvc_spec, wait_for_api
from support.ports import free_port
from support.process import http_ok

pytestmark = pytest.mark.timeout(300)


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """(series name, labels) -> value of a Prometheus text page."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(page: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float | None:
    """The sum of the samples of `name` whose labels include `labels`; None when there is none."""
    found = [v for (n, ls), v in page.items() if n == name and set(labels.items()) <= ls]
    return sum(found) if found else None


def test_failure_reasons_name_what_went_wrong():
    assert failure_reason(kopf.PermanentError("invalid spec: x")) == "InvalidSpec"
    for status, reason in ((403, "Forbidden"), (409, "Conflict"), (422, "Invalid"), (500, "ServerError")):
        try:
            raise kopf.TemporaryError("applying children failed") from ApiException(status=status)
        except kopf.TemporaryError as e:
            assert failure_reason(e) == reason
    assert failure_reason(RuntimeError("boom")) == "Unexpected"
    try:
        raise kopf.TemporaryError("applying children failed") from LookupError("Secret x is not ours")
    except kopf.TemporaryError as e:
        assert failure_reason(e) == "CannotApply"
    assert failure_reason(kopf.TemporaryError("rotation waits 30 s", delay=30)) is None  # a requeue


def test_reconcile_hook_counts_times_and_reraises():
    m = OperatorMetrics()

    @m.reconciled
    def reconcile(namespace: str, name: str, retry: int = 0) -> None:
        if name == "bad":
            raise kopf.TemporaryError("applying children failed") from ApiException(status=403)

    reconcile("ml", "good")
    reconcile(namespace="ml", name="good", retry=1)
    with pytest.raises(kopf.TemporaryError):
        reconcile("ml", "bad", 2)
    page = samples(m.render().decode())
    assert value(page, "skiff_operator_reconciles_total", inferenceservice="good") == 2
    assert value(page, "skiff_operator_reconciles_total", namespace="ml") == 3
    assert value(page, "skiff_operator_reconcile_failures_total", inferenceservice="bad") == 1
    assert value(page, "skiff_operator_reconcile_failures_total", reason="Forbidden") == 1
    assert value(page, "skiff_operator_reconcile_failures_total", inferenceservice="good") is None
    assert value(page, "skiff_operator_reconcile_duration_seconds_count", namespace="ml") == 3


def test_status_gauges_follow_the_status_and_go_with_the_object():
    m = OperatorMetrics()
    isvc = {
        "metadata": {"name": "chat", "namespace": "ml", "uid": "u", "generation": 1},
        "spec": {"replicas": 3},
    }
    status, _ = compute_status(isvc, Observed(None, [], "h"), "2026-01-01T00:00:00Z")
    m.record_status(isvc, status)
    page = samples(m.render().decode())
    ids = {"namespace": "ml", "inferenceservice": "chat"}
    assert value(page, "skiff_operator_inferenceservice_desired_replicas", **ids) == 3
    assert value(page, "skiff_operator_inferenceservice_ready_replicas", **ids) == 0
    assert value(page, "skiff_operator_inferenceservice_phase", **ids, phase=status["phase"]) == 1
    assert value(page, "skiff_operator_inferenceservice_phase", **ids) == 1  # one phase at a time
    assert {ls for (n, ls), _ in page.items() if n == "skiff_operator_inferenceservice_phase"} == {
        frozenset({**ids, "model_name": status["servedModel"], "phase": p}.items()) for p in PHASES
    }
    ready = value(page, "skiff_operator_inferenceservice_condition", **ids, condition="Ready", status="False")
    assert ready == 1
    assert value(page, "skiff_operator_inferenceservice_condition", **ids, condition="Ready") == 1
    m.record_decision(isvc, "ScaleUp", 1, 3)
    m.record_decision(isvc, "Steady", 3, 3)
    m.forget("ml", "chat")
    page = samples(m.render().decode())
    assert value(page, "skiff_operator_inferenceservice_phase") is None
    assert value(page, "skiff_operator_autoscaler_decisions_total", reason="ScaleUp", change="up") == 1
    assert value(page, "skiff_operator_autoscaler_decisions_total", reason="Steady", change="none") == 1


@pytest.fixture(scope="module")
def metrics_url() -> str:
    """The operator's metrics server, as `skiff-operator --metrics-port` starts it (a daemon thread)."""
    port = free_port()
    METRICS.serve(port, host="127.0.0.1")
    url = f"http://127.0.0.1:{port}/metrics"
    assert http_ok(url)
    return url


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    import httpx

    return samples(httpx.get(url, timeout=5).text)


def test_live_operator_exports_reconciles_status_and_failures(
    api: Api, namespace: str, operator, kubelet, metrics_url: str
) -> None:
    ns = namespace
    create_isvc(api, ns, "chat", {"resources": {"gpus": 0}, "model": {"servedName": "smol"}})

    def phase_ready():
        page = scrape(metrics_url)
        ids = {"namespace": ns, "inferenceservice": "chat", "model_name": "smol"}
        ok = value(page, "skiff_operator_inferenceservice_phase", **ids, phase="Ready") == 1
        # the first reconcile may still be pruning when its pod turns ready (an on_child status write)
        done = (value(page, "skiff_operator_reconcile_duration_seconds_count") or 0) >= 1
        return page if ok and done else None

    page = wait_for_api(phase_ready, 60, "phase Ready in the operator's metrics")
    ids = {"namespace": ns, "inferenceservice": "chat"}
    assert value(page, "skiff_operator_inferenceservice_ready_replicas", **ids) == 1
    assert value(page, "skiff_operator_inferenceservice_desired_replicas", **ids) == 1
    ready = value(page, "skiff_operator_inferenceservice_condition", **ids, condition="Ready", status="True")
    assert ready == 1
    assert value(page, "skiff_operator_reconciles_total", **ids) >= 1

    # A CEL rule the 1.20 test server cannot enforce: the operator's own check refuses it, once.
    create_isvc(api, ns, "bad-gpus", {"runtime": {"tensorParallel": 4}, "resources": {"gpus": 2}})
    invalid = {"namespace": ns, "inferenceservice": "bad-gpus", "reason": "InvalidSpec"}
    wait_for_api(
        lambda: (value(scrape(metrics_url), "skiff_operator_reconcile_failures_total", **invalid) or 0) >= 1,
        30,
        "an InvalidSpec failure counted",
    )
    # A spec the operator takes but whose Service the API server refuses (an annotation key Kubernetes
    # rejects): the apply fails with 422, reason Invalid, and kopf retries it.
    patch_isvc_spec(api, ns, "chat", {"service": {"annotations": {"not a valid key!": "x"}}})
    applied = {"namespace": ns, "inferenceservice": "chat", "reason": "Invalid"}
    wait_for_api(
        lambda: (value(scrape(metrics_url), "skiff_operator_reconcile_failures_total", **applied) or 0) >= 1,
        60,
        "an Invalid apply failure counted",
    )
    degraded = {"condition": "Degraded", "status": "True", "inferenceservice": "chat"}
    assert value(scrape(metrics_url), "skiff_operator_inferenceservice_condition", **degraded) == 1

    api.custom.delete_namespaced_custom_object("skiff.dev", "v1alpha1", ns, "inferenceservices", "chat")
    wait_for_api(
        lambda: value(scrape(metrics_url), "skiff_operator_inferenceservice_phase", **ids) is None,
        60,
        "the deleted InferenceService's status series gone",
    )
