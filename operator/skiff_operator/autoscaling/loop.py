"""One autoscaling step for one InferenceService: read load, decide, write replicas, explain.

`Autoscaler.step` does the I/O around the pure `policy.decide`; the kopf timer in handlers.py calls it.
History lives in memory per object uid: a new leader starts with none, and `decide` never scales down
on a history shorter than the window, so a failover cannot cause a sudden scale-down.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import kubernetes
from kubernetes.client.exceptions import ApiException
from skiff_contract import GROUP, KIND, PLURAL, VERSION

from skiff_operator.metadata import selector_string, served_name
from skiff_operator.spec import parse_spec

from .policy import Decision, Policy, Sample, decide
from .scrape import read_load

log = logging.getLogger("skiff_operator.autoscaling")


def _now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Outcome:
    decision: Decision
    current: int
    changed: bool
    detail: str


def external_autoscaler(api: kubernetes.client.ApiClient, isvc: dict) -> str | None:
    """The name of a user's HPA / ScaledObject that targets this InferenceService or its Deployment."""
    meta = isvc["metadata"]
    ns, name, uid = meta["namespace"], meta["name"], meta["uid"]

    def targets_us(obj: dict) -> bool:
        ref = obj.get("spec", {}).get("scaleTargetRef") or {}
        owned = any(o.get("uid") == uid for o in obj.get("metadata", {}).get("ownerReferences") or [])
        return not owned and ref.get("name") == name and ref.get("kind", "Deployment") in (KIND, "Deployment")

    try:
        hpas = kubernetes.client.AutoscalingV1Api(api).list_namespaced_horizontal_pod_autoscaler(ns)
        for h in hpas.items:
            h = api.sanitize_for_serialization(h)
            if targets_us(h):
                return f"HorizontalPodAutoscaler/{h['metadata']['name']}"
    except ApiException as e:
        log.debug("listing HPAs in %s failed: %s", ns, e)
    try:
        sos = kubernetes.client.CustomObjectsApi(api).list_namespaced_custom_object(
            "keda.sh", "v1alpha1", ns, "scaledobjects"
        )
        for so in sos.get("items", []):
            if targets_us(so):
                return f"ScaledObject/{so['metadata']['name']}"
    except ApiException as e:  # 404: KEDA not installed
        if e.status != 404:
            log.debug("listing ScaledObjects in %s failed: %s", ns, e)
    return None


@dataclass
class Autoscaler:
    api: kubernetes.client.ApiClient
    router_urls: tuple[str, ...] = ()
    clock: Callable[[], float] = time.monotonic
    history: dict[str, list[Sample]] = field(default_factory=dict)
    last_reason: dict[str, str] = field(default_factory=dict)  # per uid: one event per episode, not per tick
    timeout: float = 3.0

    def forget(self, uid: str) -> None:
        self.history.pop(uid, None)
        self.last_reason.pop(uid, None)

    def sync_deployment(self, isvc: dict) -> bool:
        """With an autoscaler (any mode) the operator's apply leaves Deployment replicas alone; they follow
        the InferenceService's spec.replicas (which the scale subresource, HPA and KEDA write) from here."""
        meta, spec = isvc["metadata"], isvc.get("spec") or {}
        want = int(spec.get("replicas", 1))
        apps = kubernetes.client.AppsV1Api(self.api)
        try:
            scale = apps.read_namespaced_deployment_scale(meta["name"], meta["namespace"])
        except ApiException as e:
            if e.status == 404:
                return False  # not created yet
            raise
        if (scale.spec.replicas or 0) == want:
            return False
        apps.patch_namespaced_deployment_scale(meta["name"], meta["namespace"], {"spec": {"replicas": want}})
        return True

    async def step(self, isvc: dict) -> Outcome | None:
        """Decide and apply for an InferenceService in `mode: operator`; None when it is not ours to scale."""
        meta = isvc["metadata"]
        try:
            spec = parse_spec(isvc.get("spec"))
        except ValueError as e:  # pydantic's ValidationError; the reconcile handler reports it in conditions
            log.info("%s/%s: invalid spec, not autoscaling: %s", meta["namespace"], meta["name"], e)
            return None
        a = spec.autoscaling
        if a is None or a.mode != "operator":
            return None
        policy = Policy.from_spec(isvc["spec"]["autoscaling"])
        other = external_autoscaler(self.api, isvc)
        current = spec.replicas
        if other is not None:
            return Outcome(
                Decision(current, "ExternalAutoscaler", f"{other} scales this service; not acting"),
                current,
                False,
                "",
            )
        pods = kubernetes.client.CoreV1Api(self.api).list_namespaced_pod(
            meta["namespace"], label_selector=selector_string(meta["name"])
        )
        pod_dicts = [self.api.sanitize_for_serialization(p) for p in pods.items]
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            reading = await read_load(
                client, a.metric, pod_dicts, served_name(isvc, spec), list(self.router_urls)
            )
        now = self.clock()
        samples = self.history.setdefault(meta["uid"], [])
        samples.append(Sample(now, reading.load, reading.ready, reading.active))
        horizon = policy.horizon + 60.0
        while samples and samples[0].time < now - horizon:
            samples.pop(0)
        decision = decide(policy, samples, current, now)
        changed = decision.replicas != current
        if changed:
            kubernetes.client.CustomObjectsApi(self.api).patch_namespaced_custom_object_scale(
                GROUP,
                VERSION,
                meta["namespace"],
                PLURAL,
                meta["name"],
                {"spec": {"replicas": decision.replicas}},
            )
        return Outcome(decision, current, changed, reading.detail)


def status_patch(outcome: Outcome, metric: str, previous: dict[str, Any] | None) -> dict[str, Any]:
    """`status.autoscaling`: what the last decision was and why."""
    d = outcome.decision
    out = {
        "desiredReplicas": d.replicas,
        "currentReplicas": outcome.current,
        "reason": d.reason,
        "message": d.message,
        "metric": metric,
        "observed": outcome.detail,
        "lastDecisionTime": _now_iso(),
    }
    last_scale = (previous or {}).get("lastScaleTime")
    out["lastScaleTime"] = _now_iso() if outcome.changed else last_scale
    return {k: v for k, v in out.items() if v not in (None, "")}  # 1.20 reads "" in a merge patch as null
