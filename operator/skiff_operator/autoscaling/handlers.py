"""kopf handlers of the autoscaler (registered by importing skiff_operator.handlers).

Timers run only in the active operator instance: kopf peering pauses every other replica, which makes the
loop leader-only. Settings come from the environment of the operator pod:
  SKIFF_AUTOSCALE_INTERVAL   seconds between decisions (default 15)
  SKIFF_ROUTER_METRICS_URL   comma-separated /metrics URLs of the router replicas (held requests, and the
                             `concurrency` metric); without it only pod metrics are read
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import kopf

from skiff_operator.metrics import METRICS
from skiff_operator.state import ISVC, STATE

from .loop import Autoscaler, status_patch

INTERVAL = float(os.environ.get("SKIFF_AUTOSCALE_INTERVAL", "15"))
ROUTER_URLS = tuple(u.strip() for u in os.environ.get("SKIFF_ROUTER_METRICS_URL", "").split(",") if u.strip())
_scaler: Autoscaler | None = None


def autoscaler() -> Autoscaler:
    global _scaler
    if _scaler is None:
        _scaler = Autoscaler(STATE.api().api, ROUTER_URLS)
    return _scaler


def _autoscaled(spec: dict, **_: Any) -> bool:
    return bool(spec.get("autoscaling"))


@kopf.timer(*ISVC, interval=INTERVAL, initial_delay=INTERVAL, when=_autoscaled)
async def autoscale(
    body: kopf.Body, spec: kopf.Spec, status: kopf.Status, patch: kopf.Patch, **_: Any
) -> None:
    scaler = autoscaler()
    isvc = dict(body)
    # every mode: Deployment replicas follow spec.replicas (what /scale, HPA and KEDA write)
    await asyncio.to_thread(scaler.sync_deployment, isvc)
    outcome = await scaler.step(isvc)
    if outcome is None:
        return
    METRICS.record_decision(isvc, outcome.decision.reason, outcome.current, outcome.decision.replicas)
    previous = dict(status.get("autoscaling") or {})
    patch.status["autoscaling"] = status_patch(outcome, spec["autoscaling"].get("metric", "queue"), previous)
    uid = body["metadata"]["uid"]
    if outcome.changed:
        # kopf.event, not kopf.info: the operator raises the posting level to WARNING for its own reasons
        kopf.event(
            isvc,
            type="Normal",
            reason=outcome.decision.reason,
            message=f"replicas {outcome.current} -> {outcome.decision.replicas}: {outcome.decision.message}",
        )
    elif (
        outcome.decision.reason == "ExternalAutoscaler"
        and scaler.last_reason.get(uid) != "ExternalAutoscaler"
    ):
        kopf.event(isvc, type="Warning", reason="ExternalAutoscaler", message=outcome.decision.message)
    scaler.last_reason[uid] = outcome.decision.reason


@kopf.on.field(*ISVC, field="spec.replicas", when=_autoscaled)
async def replicas_changed(body: kopf.Body, **_: Any) -> None:
    """Propagate a new spec.replicas (HPA, KEDA, the router's scale-from-zero, kubectl scale) at once."""
    await asyncio.to_thread(autoscaler().sync_deployment, dict(body))


@kopf.on.delete(*ISVC, optional=True)
def forget(uid: str, **_: Any) -> None:
    if _scaler is not None:
        _scaler.forget(uid)
