"""kopf handlers of the autoscaler (registered by importing skiff_operator.handlers).

One kopf daemon per autoscaled InferenceService runs the loop, only in the active operator instance: kopf
peering stops the daemons of a paused replica and starts them again on resume, which makes the loop
leader-only. kopf guards every daemon and timer with a finalizer; this one is registered without it, so
deleting an InferenceService never waits for an operator (or its RBAC) to be there. Without the finalizer
kopf does not stop a daemon when its object goes, so the loop stops itself: it reads the object on every
tick and returns once it is gone (a daemon that returns is not started again).

Settings come from the environment of the operator pod:
  SKIFF_AUTOSCALE_INTERVAL   seconds between decisions (default 15)
  SKIFF_ROUTER_METRICS_URL   comma-separated /metrics URLs of the router replicas (held requests, and the
                             `concurrency` metric); without it only pod metrics are read
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from skiff_operator.metrics import METRICS
from skiff_operator.state import ISVC, STATE

from .loop import Autoscaler, status_patch

INTERVAL = float(os.environ.get("SKIFF_AUTOSCALE_INTERVAL", "15"))
ROUTER_URLS = tuple(u.strip() for u in os.environ.get("SKIFF_ROUTER_METRICS_URL", "").split(",") if u.strip())
log = logging.getLogger("skiff_operator.autoscaling")
_scaler: Autoscaler | None = None


def autoscaler() -> Autoscaler:
    global _scaler
    if _scaler is None:
        _scaler = Autoscaler(STATE.api().api, ROUTER_URLS)
    return _scaler


def reset() -> None:
    """Forget the API connection and histories (a new operator run in the same process, as in tests)."""
    global _scaler
    _scaler = None


def _autoscaled(spec: dict, **_: Any) -> bool:
    return bool(spec.get("autoscaling"))


def _live(namespace: str, name: str, uid: str) -> dict[str, Any] | None:
    """The InferenceService as the API has it now; None once it is deleted (or replaced by a namesake)."""
    isvc = STATE.api().get_isvc(namespace, name)
    if isvc is None or isvc["metadata"].get("uid") != uid or isvc["metadata"].get("deletionTimestamp"):
        return None
    return isvc


async def tick(isvc: dict[str, Any]) -> None:
    """One decision for one InferenceService: Deployment replicas follow spec.replicas (every mode: what
    /scale, HPA and KEDA write), then, in `mode: operator`, decide, write /scale, record, explain."""
    scaler = autoscaler()
    await asyncio.to_thread(scaler.sync_deployment, isvc)
    outcome = await scaler.step(isvc)
    if outcome is None:
        return
    METRICS.record_decision(isvc, outcome.decision.reason, outcome.current, outcome.decision.replicas)
    meta, spec = isvc["metadata"], isvc["spec"]
    previous = dict((isvc.get("status") or {}).get("autoscaling") or {})
    patch = status_patch(outcome, spec["autoscaling"].get("metric", "queue"), previous)
    await asyncio.to_thread(STATE.api().write_status, meta["namespace"], meta["name"], {"autoscaling": patch})
    uid = meta["uid"]
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


@kopf.daemon(*ISVC, initial_delay=INTERVAL, when=_autoscaled, cancellation_timeout=10)
async def autoscale(stopped: kopf.DaemonStopped, namespace: str, name: str, uid: str, **_: Any) -> None:
    while not stopped:
        isvc = await asyncio.to_thread(_live, namespace, name, uid)
        if isvc is None:
            autoscaler().forget(uid)
            return
        try:
            await tick(isvc)
        except ApiException as e:  # e.g. 403: the RBAC lacks a rule; said once per tick, the loop goes on
            detail = (e.body or "")[:300] if isinstance(e.body, str) else ""
            log.warning(
                "%s/%s: autoscaling step failed: (%s) %s %s", namespace, name, e.status, e.reason, detail
            )
        await stopped.wait(INTERVAL)


def _without_finalizer(fn: Any) -> None:
    """kopf registers every daemon as needing its finalizer; drop that for `fn`'s handler (see above)."""
    registry = kopf.get_default_registry()._spawning
    registry._handlers = [
        dataclasses.replace(h, requires_finalizer=False) if h.fn is fn else h for h in registry._handlers
    ]


_without_finalizer(autoscale)


@kopf.on.field(*ISVC, field="spec.replicas", when=_autoscaled)
async def replicas_changed(body: kopf.Body, **_: Any) -> None:
    """Propagate a new spec.replicas (HPA, KEDA, the router's scale-from-zero, kubectl scale) at once."""
    await asyncio.to_thread(autoscaler().sync_deployment, dict(body))
