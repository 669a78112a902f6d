"""The operator's Prometheus metrics (`skiff_operator_*`), served on `--metrics-port`.

Handlers call three hooks: `reconciled` wraps the reconcile function (count, duration, failure reason),
`record_status` runs after each status computation (phase, conditions, replicas per InferenceService) and
`record_decision` after each autoscaler step. Per-service series carry the service's own `namespace` and
`inferenceservice` (the ServiceMonitor honours them, as for kube-state-metrics) and, on the status gauges,
`model_name` (the served name, the runtime's label), so dashboards filter all of them by the same variables.
The status gauges are computed at scrape time from the last status seen, so a deleted InferenceService's
series go away with it."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import kopf
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .status import CONDITION_TYPES

PHASES = ("Pending", "Loading", "Updating", "Ready", "Idle", "Degraded")
CONDITION_STATUSES = ("True", "False", "Unknown")
_DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_API_REASONS = {403: "Forbidden", 404: "NotFound", 409: "Conflict", 422: "Invalid", 429: "TooManyRequests"}
P = ParamSpec("P")
R = TypeVar("R")


def failure_reason(error: BaseException) -> str | None:
    """A small, fixed vocabulary for `reason`: what an operator on call can act on. None: not a failure (a
    TemporaryError raised without a cause is a requeue, e.g. a key rotation deferred after a reconcile that
    applied everything)."""
    if isinstance(error, kopf.PermanentError):
        return "InvalidSpec"
    if isinstance(error, kopf.TemporaryError) and error.__cause__ is None:
        return None
    cause = error.__cause__ if isinstance(error, kopf.TemporaryError) else error
    if isinstance(cause, ApiException):
        status = int(cause.status or 0)
        return _API_REASONS.get(status, "ServerError" if status >= 500 else "ApiError")
    if isinstance(cause, LookupError):  # a kind the cluster does not serve, or a name another object holds
        return "CannotApply"
    return "Unexpected"


@dataclass(frozen=True)
class ServiceStatus:
    """What the status gauges show of one InferenceService."""

    model_name: str
    phase: str
    conditions: dict[str, str]  # type -> True / False / Unknown
    desired: int
    ready: int


class StatusCollector(Collector):
    def __init__(self) -> None:
        self._services: dict[tuple[str, str], ServiceStatus] = {}
        self._lock = threading.Lock()

    def set(self, namespace: str, name: str, status: ServiceStatus) -> None:
        with self._lock:
            self._services[(namespace, name)] = status

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._services.pop((namespace, name), None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            services = sorted(self._services.items())
        ids = ["namespace", "inferenceservice", "model_name"]
        phase = GaugeMetricFamily(
            "skiff_operator_inferenceservice_phase",
            "1 for the phase an InferenceService is in (status.phase), 0 for the others",
            labels=[*ids, "phase"],
        )
        condition = GaugeMetricFamily(
            "skiff_operator_inferenceservice_condition",
            "1 for each condition's current status, 0 for the other statuses",
            labels=[*ids, "condition", "status"],
        )
        desired = GaugeMetricFamily(
            "skiff_operator_inferenceservice_desired_replicas",
            "Replicas the InferenceService asks for (spec.replicas, which the autoscaler writes)",
            labels=ids,
        )
        ready = GaugeMetricFamily(
            "skiff_operator_inferenceservice_ready_replicas",
            "Pods of the InferenceService that pass readiness (status.readyReplicas)",
            labels=ids,
        )
        for (namespace, name), s in services:
            key = [namespace, name, s.model_name]
            for p in PHASES:
                phase.add_metric([*key, p], 1.0 if s.phase == p else 0.0)
            for ctype in CONDITION_TYPES:
                for cstatus in CONDITION_STATUSES:
                    value = 1.0 if s.conditions.get(ctype) == cstatus else 0.0
                    condition.add_metric([*key, ctype, cstatus], value)
            desired.add_metric(key, float(s.desired))
            ready.add_metric(key, float(s.ready))
        yield from (phase, condition, desired, ready)

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # computed at scrape time: nothing to check at registration


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r, ids = self.registry, ["namespace", "inferenceservice"]
        self.reconciles = Counter(
            "skiff_operator_reconciles", "Reconciles of an InferenceService, every outcome", ids, registry=r
        )
        self.reconcile_failures = Counter(
            "skiff_operator_reconcile_failures",
            "Reconciles that failed, by reason (InvalidSpec, Forbidden, Conflict, Invalid, ServerError, ...)",
            [*ids, "reason"],
            registry=r,
        )
        self.reconcile_duration = Histogram(
            "skiff_operator_reconcile_duration_seconds",
            "Time one reconcile took: render, apply, prune and status",
            ["namespace"],
            registry=r,
            buckets=_DURATION_BUCKETS,
        )
        self.decisions = Counter(
            "skiff_operator_autoscaler_decisions",
            "Autoscaler decisions by reason, and whether they changed the replicas (up, down, none)",
            [*ids, "reason", "change"],
            registry=r,
        )
        self.status = StatusCollector()
        r.register(self.status)

    def reconciled(self, reconcile: Callable[P, R]) -> Callable[P, R]:
        """Wraps `reconcile(namespace, name, ...)`: counts it, times it and names why it failed."""

        @functools.wraps(reconcile)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            given = dict(zip(("namespace", "name"), args, strict=False)) | kwargs
            namespace, name = str(given["namespace"]), str(given["name"])
            self.reconciles.labels(namespace=namespace, inferenceservice=name).inc()
            started = time.perf_counter()
            try:
                return reconcile(*args, **kwargs)
            except Exception as e:
                reason = failure_reason(e)
                if reason is not None:
                    failures = self.reconcile_failures.labels(
                        namespace=namespace, inferenceservice=name, reason=reason
                    )
                    failures.inc()
                raise
            finally:
                self.reconcile_duration.labels(namespace=namespace).observe(time.perf_counter() - started)

        return wrapper

    def record_status(self, isvc: dict[str, Any], status: dict[str, Any]) -> None:
        """The status just computed for `isvc` (`forget` drops it once the object is gone)."""
        meta = isvc["metadata"]
        conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
        replicas = (isvc.get("spec") or {}).get("replicas", 1)
        self.status.set(
            meta["namespace"],
            meta["name"],
            ServiceStatus(
                str(status.get("servedModel") or meta["name"]),
                str(status.get("phase") or "Pending"),
                conditions,
                int(replicas),
                int(status.get("readyReplicas") or 0),
            ),
        )

    def forget(self, namespace: str, name: str) -> None:
        self.status.forget(namespace, name)

    def record_decision(self, isvc: dict[str, Any], reason: str, current: int, replicas: int) -> None:
        meta = isvc["metadata"]
        change = "up" if replicas > current else "down" if replicas < current else "none"
        self.decisions.labels(
            namespace=meta["namespace"], inferenceservice=meta["name"], reason=reason, change=change
        ).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        """GET /metrics on host:port from a daemon thread (prometheus_client's own server)."""
        start_http_server(port, addr=host, registry=self.registry)


METRICS = OperatorMetrics()
