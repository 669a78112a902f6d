"""The pure status function: an InferenceService + its observed Deployment and Pods -> status and events.

Conditions as Kubernetes users read them: `Ready` while the service can answer (a replica passes the
real-token readiness probe, or it is scaled to zero and the router wakes it on a request); `Available` when
every wanted replica of the *current* template (the hash the operator renders from the current spec) is
ready; `Progressing` during a rollout or a scale; `Degraded` naming the cause a user can fix (problems.py);
`ModelReady` for the model fetch. `observedGeneration` says which spec they describe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from skiff_contract import parse_source

from .metadata import LABEL_HASH, selector_string, served_name
from .problems import child_problem, failure_text, plural, terminated
from .render import OperatorSettings, service_url
from .spec import parse_spec

CONDITION_TYPES = ("Ready", "Available", "ModelReady", "Progressing", "Degraded")
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
            failed = terminated(init)
            if failed and failed.get("exitCode") not in (None, 0):
                failure = failure_text(failed)
            elif (init.get("state") or {}).get("running"):
                downloading = True
    if failure:
        return "False", "ModelUnavailable", failure
    if downloading:
        return "Unknown", "Downloading", "fetching or verifying the model"
    if want == 0:
        return "Unknown", "ScaledToZero", "no pods to report on the model"
    return "Unknown", "Pending", "waiting for a pod to fetch the model"


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
    ready_any = sum(1 for p in live if _pod_ready(p))
    # The template the Deployment holds is the current one. (Its observedGeneration is not asked: a scale
    # bumps the Deployment's generation too, and that is no rollout.)
    synced = bool(dep and dep["metadata"].get("annotations", {}).get(LABEL_HASH) == seen.desired_hash)
    total = int(dep_status.get("replicas") or 0)
    updated = len(current) if synced else 0

    model = _model_condition(parse_source(spec.model.source).scheme, current, want)
    pods_ready = f"{ready_current}/{plural(want, 'replica')} of the current template ready"
    if dep is None:
        available = ("False", "DeploymentMissing", "the Deployment does not exist yet")
    elif want == 0:
        available = ("True", "ScaledToZero", "0 replicas requested")
    elif synced and ready_current >= want:
        available = ("True", "AllReplicasReady", pods_ready)
    else:
        available = ("False", "ReplicasNotReady", pods_ready)
    if dep is not None and not synced:
        progressing = ("True", "RollingOut", "the Deployment is taking the current template")
    elif synced and (updated < want or ready_current < want) and want:
        progressing = ("True", "RollingOut" if total > updated else "Scaling", pods_ready)
    elif total > want:
        progressing = ("True", "Scaling", f"{plural(total, 'replica')}, {want} wanted")
    else:
        progressing = ("False", "Complete", "no change in progress")

    problem = child_problem(dep, current or live)
    if seen.reconcile_error:
        degraded = ("True", "ReconcileFailed", seen.reconcile_error)
    elif model[0] == "False":
        degraded = ("True", model[1], model[2])
    elif problem:
        degraded = ("True", *problem)
    else:
        degraded = ("False", "AsExpected", "no problems observed")
    # Ready: the service answers now (a pod of any template passes the probe), or scaled to zero, when a
    # request through the router wakes it. A rollout in progress is Progressing, not NotReady.
    if ready_any >= 1:
        ready = ("True", "Serving", f"{plural(ready_any, 'replica')} ready")
    elif dep is not None and want == 0 and degraded[0] == "False":
        ready = ("True", "ScaledToZero", "no replicas; a request through the router wakes it")
    elif degraded[0] == "True":
        ready = ("False", degraded[1], degraded[2])
    elif dep is None:
        ready = ("False", "DeploymentMissing", "the Deployment does not exist yet")
    else:
        ready = ("False", "Starting", f"0/{plural(want, 'replica')} ready")

    values = {
        "Ready": ready,
        "Available": available,
        "ModelReady": model,
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
        events.extend(_transition_event(ctype, (status, reason, message), old))

    if degraded[0] == "True":
        phase = "Degraded"
    elif want == 0:
        phase = "Idle"
    elif ready_current >= want and synced:
        phase = "Ready"
    elif ready_any:
        phase = "Updating"
    else:
        phase = "Loading" if live else "Pending"
    status_body = {
        "observedGeneration": generation,
        "conditions": conditions,
        "desiredReplicas": want,
        "replicas": total,
        # counted from the pods, like Ready itself: the Deployment's own count can lag them
        "readyReplicas": max(int(dep_status.get("readyReplicas") or 0), ready_any),
        "updatedReplicas": updated,
        "selector": selector_string(isvc["metadata"]["name"]),
        "url": service_url(isvc, settings, spec),
        "servedModel": served_name(isvc, spec),
        "phase": phase,
    }
    return status_body, events


def _transition_event(ctype: str, value: tuple[str, str, str], old: dict[str, Any] | None) -> list[Event]:
    """Events for condition changes: Warning only for a real problem (Degraded, or Ready lost to one),
    Normal for a normal start, scale or rollout; nothing for the first, healthy status of a new object."""
    status, reason, message = value
    was = (old or {}).get("status")
    text = f"{reason}: {message}".rstrip(": ")
    if ctype == "Degraded":
        if status == "True" and (was != "True" or old.get("reason") != reason):
            return [Event("Warning", reason, message)]
        if status == "False" and was == "True":
            return [Event("Normal", "Recovered", "no longer degraded")]
        return []
    if status == was:
        return []
    if ctype == "Ready" and status == "True":
        return [Event("Normal", "Ready", text)]
    if ctype == "Ready" and was == "True":  # lost: a Warning only where Degraded names no cause already
        return [
            Event("Normal" if reason in ("Starting", "DeploymentMissing") else "Warning", "NotReady", text)
        ]
    if ctype == "ModelReady" and status == "True":
        return [Event("Normal", "ModelReady", message)]
    if ctype == "Progressing" and status == "True":
        return [Event("Normal", reason, message)]
    return []


def status_changed(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    old = old or {}
    return any(old.get(k) != v for k, v in new.items())
