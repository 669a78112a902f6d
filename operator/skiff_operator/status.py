"""The pure status function: an InferenceService + its observed Deployment and Pods -> status and events.

Ready means the *current* generation's pods (those carrying the template hash the operator renders from the
current spec) pass the real-token readiness probe; `observedGeneration` says which spec that was."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from skiff_contract import parse_source

from .metadata import LABEL_HASH, selector_string, served_name
from .render import OperatorSettings, service_url
from .spec import parse_spec

CONDITION_TYPES = ("Ready", "ModelReady", "WorkloadReady", "Progressing", "Degraded")
INIT_CONTAINER = "model-download"


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    deployment: dict[str, Any] | None
    pods: list[dict[str, Any]]
    desired_hash: str
    reconcile_error: str | None = None


def _pod_ready(pod: dict[str, Any]) -> bool:
    conds = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _terminated(status: dict[str, Any]) -> dict[str, Any] | None:
    for key in ("state", "lastState"):
        term = (status.get(key) or {}).get("terminated")
        if term:
            return term
    return None


def _failure_text(term: dict[str, Any]) -> str:
    text = (term.get("message") or "").strip() or term.get("reason") or "failed"
    return f"exit code {term.get('exitCode')}: {text.splitlines()[-1] if text else ''}"


def _model_condition(scheme: str, pods: list[dict[str, Any]], want: int) -> tuple[str, str, str]:
    if scheme == "embedded":
        return "True", "EmbeddedModel", "serving the runtime's embedded model"
    failure = downloading = None
    for pod in pods:
        st = pod.get("status", {})
        if any((c.get("state") or {}).get("running") for c in st.get("containerStatuses") or []):
            return "True", "ModelAvailable", "the model is in place and the server started"
        for init in st.get("initContainerStatuses") or []:
            if init.get("name") != INIT_CONTAINER:
                continue
            term = (init.get("state") or {}).get("terminated")
            if term and term.get("exitCode") == 0:
                return "True", "ModelAvailable", "the model download/verification step succeeded"
            failed = _terminated(init)
            if failed and failed.get("exitCode") not in (None, 0):
                failure = _failure_text(failed)
            elif (init.get("state") or {}).get("running"):
                downloading = True
    if failure:
        return "False", "ModelUnavailable", failure
    if downloading:
        return "Unknown", "Downloading", "fetching or verifying the model"
    if want == 0:
        return "Unknown", "ScaledToZero", "no pods to report on the model"
    return "Unknown", "Pending", "waiting for a pod to fetch the model"


def _crash(pods: list[dict[str, Any]]) -> str | None:
    for pod in pods:
        for cs in pod.get("status", {}).get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in (
                "CrashLoopBackOff",
                "ImagePullBackOff",
                "ErrImagePull",
                "CreateContainerConfigError",
            ):
                term = cs.get("lastState", {}).get("terminated")
                detail = _failure_text(term) if term else waiting.get("message", "")
                return f"{pod['metadata']['name']}: {waiting['reason']} {detail}".strip()
    return None


def compute_status(
    isvc: dict[str, Any], seen: Observed, now: str, settings: OperatorSettings | None = None
) -> tuple[dict[str, Any], list[Event]]:
    settings = settings or OperatorSettings()
    spec = parse_spec(isvc.get("spec"))
    generation = int(isvc["metadata"].get("generation") or 0)
    dep = seen.deployment
    dep_status = (dep or {}).get("status") or {}
    want = spec.replicas if spec.autoscaling is None or dep is None else int(dep["spec"].get("replicas") or 0)
    live = [p for p in seen.pods if not p["metadata"].get("deletionTimestamp")]
    current = [p for p in live if p["metadata"].get("labels", {}).get(LABEL_HASH) == seen.desired_hash]
    ready_current = sum(1 for p in current if _pod_ready(p))
    synced = bool(
        dep
        and dep["metadata"].get("annotations", {}).get(LABEL_HASH) == seen.desired_hash
        and dep_status.get("observedGeneration", 0) >= dep["metadata"].get("generation", 0)
    )
    total = int(dep_status.get("replicas") or 0)
    updated = int(dep_status.get("updatedReplicas") or 0) if synced else 0

    model = _model_condition(parse_source(spec.model.source).scheme, current, want)
    if dep is None:
        workload = ("False", "DeploymentMissing", "the Deployment does not exist yet")
    elif not synced:
        workload = ("False", "RolloutPending", "the Deployment has not observed the current template yet")
    elif want == 0:
        workload = ("False", "ScaledToZero", "0 replicas requested")
    elif ready_current >= want and updated >= want:
        workload = ("True", "AllReplicasReady", f"{ready_current}/{want} current pods ready")
    else:
        workload = ("False", "ReplicasNotReady", f"{ready_current}/{want} current pods ready")
    rolling = not synced or updated < want or total > want or ready_current < want
    progressing = (
        ("True", "RollingOut", f"{updated} updated, {total} total, {want} wanted")
        if rolling and want
        else ("False", "RolloutComplete", "no change in progress")
    )

    dep_conds = {c.get("type"): c for c in dep_status.get("conditions") or []}
    deadline = dep_conds.get("Progressing", {}).get("reason") == "ProgressDeadlineExceeded"
    crash = _crash(current)
    if seen.reconcile_error:
        degraded = ("True", "ReconcileFailed", seen.reconcile_error)
    elif model[0] == "False":
        degraded = ("True", model[1], model[2])
    elif crash:
        degraded = ("True", "ServerCrashing", crash)
    elif deadline:
        degraded = ("True", "ProgressDeadlineExceeded", dep_conds["Progressing"].get("message", ""))
    else:
        degraded = ("False", "AsExpected", "no problems observed")
    if workload[0] == "True" and degraded[0] == "False":
        ready = ("True", "Serving", f"{ready_current} pods of generation {generation} ready")
    else:
        blocker = degraded if degraded[0] == "True" else workload
        ready = ("False", blocker[1], blocker[2])

    values = {
        "Ready": ready,
        "ModelReady": model,
        "WorkloadReady": workload,
        "Progressing": progressing,
        "Degraded": degraded,
    }
    previous = {c["type"]: c for c in (isvc.get("status") or {}).get("conditions") or []}
    conditions, events = [], []
    for ctype in CONDITION_TYPES:
        status, reason, message = values[ctype]
        old = previous.get(ctype)
        changed = old is None or old.get("status") != status
        conditions.append(
            {
                "type": ctype,
                "status": status,
                "reason": reason,
                "message": message or reason,
                "lastTransitionTime": now if changed else old.get("lastTransitionTime", now),
                "observedGeneration": generation,
            }
        )
        if ctype == "Degraded" and status == "False" and (old is None or old.get("status") != "True"):
            continue  # born healthy: no "Recovered" event
        if changed or (ctype == "Degraded" and status == "True" and old and old.get("reason") != reason):
            events.extend(_transition_event(ctype, status, reason, message))

    if degraded[0] == "True":
        phase = "Degraded"
    elif want == 0:
        phase = "Idle"
    elif ready[0] == "True":
        phase = "Ready"
    elif any(_pod_ready(p) for p in live):
        phase = "Updating"
    else:
        phase = "Loading" if live else "Pending"
    status_body = {
        "observedGeneration": generation,
        "conditions": conditions,
        "replicas": total,
        # counted from the pods, like Ready itself: the Deployment's own count can lag them
        "readyReplicas": max(
            int(dep_status.get("readyReplicas") or 0), sum(1 for p in live if _pod_ready(p))
        ),
        "updatedReplicas": updated,
        "selector": selector_string(isvc["metadata"]["name"]),
        "url": service_url(isvc, settings, spec),
        "servedModel": served_name(isvc, spec),
        "phase": phase,
    }
    return status_body, events


def _transition_event(ctype: str, status: str, reason: str, message: str) -> list[Event]:
    if ctype == "Ready":
        return [
            Event(
                "Normal" if status == "True" else "Warning" if reason != "RolloutPending" else "Normal",
                "Ready" if status == "True" else "NotReady",
                f"{reason}: {message}".rstrip(": "),
            )
        ]
    if ctype == "Degraded" and status == "True":
        return [Event("Warning", reason, message)]
    if ctype == "Degraded":
        return [Event("Normal", "Recovered", "no longer degraded")]
    if ctype == "ModelReady" and status == "True":
        return [Event("Normal", "ModelReady", message)]
    return []


def status_changed(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    old = old or {}
    return any(old.get(k) != v for k, v in new.items())
