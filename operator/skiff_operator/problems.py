"""What keeps an InferenceService's children from running, read from the Deployment's conditions and the
pods' conditions and container states: the cause a user can fix, as a (reason, message) pair for
`Degraded=True`. Pure functions over the objects as the API returns them (plain dicts)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Problem = tuple[str, str]  # (CamelCase reason, message)

# Container waiting reasons that do not fix themselves, by the Degraded reason they report.
WAITING_REASONS: dict[str, str] = {
    "CrashLoopBackOff": "ServerCrashing",
    "ImagePullBackOff": "ImagePullFailed",
    "ErrImagePull": "ImagePullFailed",
    "InvalidImageName": "ImagePullFailed",
    "CreateContainerConfigError": "ContainerConfigInvalid",
    "CreateContainerError": "ContainerConfigInvalid",
}


def terminated(status: dict[str, Any]) -> dict[str, Any] | None:
    for key in ("state", "lastState"):
        term = (status.get(key) or {}).get("terminated")
        if term:
            return term
    return None


def failure_text(term: dict[str, Any]) -> str:
    text = (term.get("message") or "").strip() or term.get("reason") or "failed"
    return f"exit code {term.get('exitCode')}: {text.splitlines()[-1] if text else ''}"


def _name(pod: dict[str, Any]) -> str:
    return pod.get("metadata", {}).get("name", "pod")


def container_problem(pods: list[dict[str, Any]]) -> Problem | None:
    """A crash loop, an image that cannot be pulled, a container that cannot be created (init ones too)."""
    for pod in pods:
        st = pod.get("status", {})
        for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            reason = WAITING_REASONS.get(waiting.get("reason", ""))
            if reason is None:
                continue
            term = (cs.get("lastState") or {}).get("terminated")
            detail = failure_text(term) if term and reason == "ServerCrashing" else waiting.get("message", "")
            text = f"{_name(pod)}: {cs.get('name')}: {waiting['reason']} {detail}".strip()
            return reason, text
    return None


def scheduling_problem(pods: list[dict[str, Any]]) -> Problem | None:
    """A pod the scheduler cannot place, with the scheduler's own words (unbound claims named apart)."""
    for pod in pods:
        for c in pod.get("status", {}).get("conditions") or []:
            if (
                c.get("type") == "PodScheduled"
                and c.get("status") == "False"
                and c.get("reason") == "Unschedulable"
            ):
                message = c.get("message") or "no node fits the pod"
                reason = "VolumeNotBound" if "unbound" in message.lower() else "Unschedulable"
                return reason, f"{_name(pod)}: {message}"
    return None


def deployment_problem(dep: dict[str, Any] | None) -> Problem | None:
    """The Deployment cannot create pods (ReplicaFailure: quota, a missing PriorityClass, admission), or its
    rollout ran past progressDeadlineSeconds."""
    conds = {c.get("type"): c for c in ((dep or {}).get("status") or {}).get("conditions") or []}
    failure = conds.get("ReplicaFailure", {})
    if failure.get("status") == "True":
        return "ReplicaFailure", failure.get("message") or failure.get("reason") or "pods cannot be created"
    progressing = conds.get("Progressing", {})
    if progressing.get("reason") == "ProgressDeadlineExceeded":
        return "ProgressDeadlineExceeded", progressing.get("message", "")
    return None


CHECKS: tuple[Callable[..., Problem | None], ...] = (container_problem, scheduling_problem)


def child_problem(dep: dict[str, Any] | None, pods: list[dict[str, Any]]) -> Problem | None:
    """The first cause found: the pods' own states first (most specific), then the Deployment's."""
    for check in CHECKS:
        found = check(pods)
        if found:
            return found
    return deployment_problem(dep)


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
