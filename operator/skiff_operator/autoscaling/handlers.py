"""kopf handlers of the autoscaler (imported by skiff_operator.handlers when present).

Timers run only in the active operator instance: kopf peering pauses every other replica, which makes the
loop leader-only. Settings come from the environment of the operator pod:
  SKIFF_AUTOSCALE_INTERVAL   seconds between decisions (default 15)
  SKIFF_ROUTER_METRICS_URL   comma-separated /metrics URLs of the router replicas (held requests, and the
                             `concurrency` metric); without it only pod metrics are read
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import kopf
import kubernetes
from kubernetes.client.exceptions import ApiException

from skiff_operator.handlers import ISVC, STATE
from skiff_operator.spec import GROUP, PLURAL, VERSION

from .loop import Autoscaler, status_patch

INTERVAL = float(os.environ.get("SKIFF_AUTOSCALE_INTERVAL", "15"))
ROUTER_URLS = tuple(u.strip() for u in os.environ.get("SKIFF_ROUTER_METRICS_URL", "").split(",") if u.strip())
_scaler: Autoscaler | None = None
_timed: set[tuple[str, str]] = set()  # autoscaled services seen: kopf guards their timers with its finalizer
log = logging.getLogger(__name__)


def autoscaler() -> Autoscaler:
    global _scaler
    if _scaler is None:
        _scaler = Autoscaler(STATE.api().api, ROUTER_URLS)
    return _scaler


def _autoscaled(spec: dict, **_: Any) -> bool:
    return bool(spec.get("autoscaling"))


@kopf.timer(*ISVC, interval=INTERVAL, initial_delay=INTERVAL, when=_autoscaled)
async def autoscale(body: kopf.Body, spec: kopf.Spec, status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
    scaler = autoscaler()
    isvc = dict(body)
    # every mode: Deployment replicas follow spec.replicas (what /scale, HPA and KEDA write)
    await asyncio.to_thread(scaler.sync_deployment, isvc)
    outcome = await scaler.step(isvc)
    if outcome is None:
        return
    previous = dict(status.get("autoscaling") or {})
    patch.status["autoscaling"] = status_patch(outcome, spec["autoscaling"].get("metric", "queue"), previous)
    uid = body["metadata"]["uid"]
    if outcome.changed:
        # kopf.event, not kopf.info: the operator raises the posting level to WARNING for its own reasons
        kopf.event(isvc, type="Normal", reason=outcome.decision.reason,
                   message=f"replicas {outcome.current} -> {outcome.decision.replicas}: {outcome.decision.message}")
    elif outcome.decision.reason == "ExternalAutoscaler" and scaler.last_reason.get(uid) != "ExternalAutoscaler":
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


@kopf.on.event(*ISVC)
def track(event: dict, body: kopf.Body, **_: Any) -> None:
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    if event.get("type") == "DELETED" or not (body.get("spec") or {}).get("autoscaling"):
        _timed.discard(key)
    else:
        _timed.add(key)


@kopf.on.cleanup()
async def release_timer_finalizers(settings: kopf.OperatorSettings, **_: Any) -> None:
    """kopf puts its finalizer on every object with a timer. On the operator's way out (helm uninstall, scale
    to 0, a rollout) it comes off, so `kubectl delete` never waits for an operator that is gone; the next
    instance puts it back when it resumes the timers."""
    await asyncio.to_thread(_release, settings.persistence.finalizer, sorted(_timed))


def _release(finalizer: str, keys: list[tuple[str, str]]) -> None:
    api = kubernetes.client.CustomObjectsApi(STATE.api().api)
    for namespace, name in keys:
        try:
            obj = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            kept = [f for f in obj["metadata"].get("finalizers") or [] if f != finalizer]
            if kept != (obj["metadata"].get("finalizers") or []):
                patch = {"metadata": {"finalizers": kept, "resourceVersion": obj["metadata"]["resourceVersion"]}}
                api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)
        except ApiException as e:  # gone, or changed meanwhile: the next instance resumes it either way
            log.info("%s/%s: finalizer left in place: %s", namespace, name, e.reason)
