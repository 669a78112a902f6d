"""Reconciles under concurrency on a real API server, as the installed ServiceAccount: 50 InferenceServices
created at once, then an operator restart that resumes all of them, post no ReconcileFailed and no Warning
(the discovery cache once raced here: KeyError 'resources'/'apis' failed applies)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from op_helpers import running_operator
from support.kube import Api, create_isvc, wait_for_api

pytestmark = pytest.mark.timeout(600)
COUNT = 50


def warnings_on_services(api: Api, ns: str) -> list[str]:
    events = api.core.list_namespaced_event(ns, field_selector="involvedObject.kind=InferenceService").items
    return [f"{e.involved_object.name}: {e.reason}: {e.message}" for e in events if e.type == "Warning"]


def deployments(api: Api, ns: str) -> int:
    return len(api.apps.list_namespaced_deployment(ns).items)


def test_fifty_at_once_and_a_restart(api: Api, namespace: str, operator_kubeconfig) -> None:
    ns = namespace
    spec = {"resources": {"gpus": 0}}
    with running_operator(ns, operator_kubeconfig) as runner:
        with ThreadPoolExecutor(max_workers=COUNT) as pool:
            list(pool.map(lambda i: create_isvc(api, ns, f"svc-{i}", spec), range(COUNT)))
        wait_for_api(lambda: deployments(api, ns) == COUNT, 240, f"{COUNT} Deployments")
        wait_for_api(
            lambda: len(api.core.list_namespaced_service(ns).items) == 2 * COUNT, 120, "all Services"
        )
    assert "KeyError" not in runner.output and "applying children failed" not in runner.output
    assert warnings_on_services(api, ns) == []
    with running_operator(ns, operator_kubeconfig) as runner:
        # kopf resumes every object (a reconcile each) and replays its children's events
        wait_for_api(lambda: deployments(api, ns) == COUNT, 60, "the Deployments kept")
        time.sleep(15)
    assert "applying children failed" not in runner.output
    assert warnings_on_services(api, ns) == []
    items = api.custom.list_namespaced_custom_object("skiff.dev", "v1alpha1", ns, "inferenceservices")[
        "items"
    ]
    degraded = [
        i["metadata"]["name"]
        for i in items
        for c in (i.get("status") or {}).get("conditions") or []
        if c["type"] == "Degraded" and c["status"] == "True"
    ]
    assert degraded == []
